// Sharded checkpoints of the Llama model on the thread mesh: round trips at TP 1, 2, 4; saved at one TP size and
// loaded at another (parameters bit for bit, forward outputs against the unsharded model); bad checkpoints with
// the words of their errors; a save killed (SIGKILL, in a child process) leaves the previous checkpoint loadable.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <nlohmann/json.hpp>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

using tp_plan = models::llama_plan<false>;
using sequence_plan = models::llama_plan<true>;

/// 62 tokens of vocabulary (padded to 64 at TP 4) and 2 key-value heads for 4 query heads (repeated at TP 4).
models::LlamaConfig config(std::uint64_t seed = 1234, std::size_t layers = 2, std::size_t hidden = 64) {
  models::LlamaConfig c;
  c.vocabulary = 62, c.dim = 32, c.layers = layers, c.heads = 4, c.kv_heads = 2, c.hidden = hidden, c.sequence = 8;
  c.seed = seed;
  return c;
}

models::LlamaConfig llama_config_with_layers(std::size_t layers) { return config(1234, layers); }

std::vector<std::int64_t> some_ids(models::LlamaConfig const& c) {
  std::vector<std::int64_t> ids;
  for (std::size_t t = 0; t < 2 * c.sequence; ++t)
    ids.push_back(static_cast<std::int64_t>((t * 37 + 5) % c.vocabulary));
  return ids;
}

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(std::string const& name)
      : path(fs::temp_directory_path() / ("shardwise_test_checkpoint_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

/// Every parameter as the unsharded model holds it, in traversal order: gathered over tp, key-value heads
/// repeated for TP kept once, vocabulary padding left out. Written here, not by the code under test.
template <class Model, class Tp>
std::vector<std::vector<float>> full_parameters(Model& model, Tp const& tp, std::size_t vocabulary) {
  std::vector<std::vector<float>> all;
  sw::detail::for_each_parameter(model, [&](auto const& p) {
    using P = typename std::remove_cvref_t<decltype(p)>::grad_placement;
    using Tensor = typename std::remove_cvref_t<decltype(p)>::tensor_type;
    if (p.value->size() == 0) return;
    Tensor whole = *p.value;
    if constexpr (sw::is_shard_v<P>) {
      Tensor gathered;
      sw::all_gather(tp, *p.value, gathered, P::dim);
      whole = gathered;
    }
    if (p.copies > 1) {
      auto const block = static_cast<Eigen::Index>(p.copy_block), copies = static_cast<Eigen::Index>(p.copies);
      Tensor first(whole.rows() / copies, whole.cols());
      for (Eigen::Index b = 0; b < first.rows() / block; ++b)
        first.middleRows(b * block, block) = whole.middleRows(b * copies * block, block);
      whole = first;
    }
    auto const rows = p.path == "tok_embeddings" || p.path == "output"
                          ? std::min<Eigen::Index>(whole.rows(), static_cast<Eigen::Index>(vocabulary))
                          : whole.rows();
    std::vector<float> values;
    for (Eigen::Index i = 0; i < rows; ++i)
      for (Eigen::Index j = 0; j < whole.cols(); ++j) values.push_back(whole(i, j));
    all.push_back(std::move(values));
  });
  return all;
}

/// The logits of the whole vocabulary for `ids`, gathered over tp.
template <class Model, class Tp>
sw::nn::matrix<float> full_logits(Model& model, Tp const& tp, std::vector<std::int64_t> const& ids,
                                  std::size_t vocabulary) {
  auto const logits = model.forward(ids);
  sw::nn::matrix<float> all;
  sw::all_gather(tp, logits.local, all, -1);
  return all.leftCols(static_cast<Eigen::Index>(vocabulary));
}

/// The unsharded model's parameters and logits, the reference for everything below.
struct Reference {
  std::vector<std::vector<float>> parameters;
  sw::nn::matrix<float> logits;
};
Reference reference(models::LlamaConfig const& c) {
  Reference r;
  sw::run_threads(1, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {1}));
    models::Llama<float> model(c);
    sw::parallelize(model, tp);
    r.parameters = full_parameters(model, tp, c.vocabulary);
    r.logits = full_logits(model, tp, some_ids(c), c.vocabulary);
  });
  return r;
}

template <class Plan>
void save_at(int ranks, models::LlamaConfig const& c, fs::path const& dir, std::int64_t step) {
  sw::run_threads(ranks, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
    models::Llama<float, Plan> model(c);
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, dir, step, {{"note", "test"}});
  });
}

/// Loads `dir` at `ranks` into a model initialized from another seed; checks parameters (exactly) and logits.
template <class Plan>
void load_and_check(int ranks, models::LlamaConfig const& c, fs::path const& dir, Reference const& expected,
                    std::int64_t step) {
  INFO("loading at TP " << ranks);
  sw::run_threads(ranks, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
    auto other = c;
    other.seed = c.seed + 999;  // different weights until loaded
    models::Llama<float, Plan> model(other);
    sw::parallelize(model, tp);
    auto const index = sw::load_sharded(model, tp, dir);
    auto const parameters = full_parameters(model, tp, c.vocabulary);
    auto const logits = full_logits(model, tp, some_ids(c), c.vocabulary);
    if (world.rank() != 0) return;
    CHECK(index.step == step);
    CHECK(index.metadata.at("note") == "test");
    REQUIRE(parameters.size() == expected.parameters.size());
    for (std::size_t i = 0; i < parameters.size(); ++i)
      CHECK_MESSAGE(parameters[i] == expected.parameters[i], "parameter " << i);
    REQUIRE(logits.rows() == expected.logits.rows());
    REQUIRE(logits.cols() == expected.logits.cols());
    float const scale = expected.logits.cwiseAbs().maxCoeff();
    CHECK((logits - expected.logits).cwiseAbs().maxCoeff() <= 1e-5f * scale);
  });
}

/// Runs fn, which must throw a shardwise::error holding every one of `words`; returns the message.
template <class Fn>
std::string check_error(Fn&& fn, std::initializer_list<std::string> words) {
  std::string message;
  try {
    fn();
  } catch (sw::error const& e) {
    message = e.what();
    CHECK_MESSAGE(message.rfind("shardwise::", 0) == 0, message);
    for (auto const& w : words)
      CHECK_MESSAGE(message.find(w) != std::string::npos, "missing \"" << w << "\" in: " << message);
  }
  CHECK_MESSAGE(!message.empty(), "no shardwise::error was thrown");
  return message;
}

/// Edits the checkpoint's index as JSON, as a corrupt or hand-edited index would be.
template <class Edit>
void edit_index(fs::path const& ckpt, Edit&& edit) {
  fs::path const file = ckpt / "shardwise_checkpoint.json";
  auto index = nlohmann::json::parse(std::ifstream(file));
  edit(index);
  std::ofstream(file, std::ios::trunc) << index.dump(1);
}

/// The entry of tensor `name` in an index.
nlohmann::json& entry(nlohmann::json& index, std::string const& name) {
  for (auto& t : index.at("tensors"))
    if (t.at("name") == name) return t;
  FAIL("no tensor " << name << " in the index");
  throw;
}

/// A safetensors file taken apart here (not by the code under test): 8-byte little-endian header length, the
/// header's JSON, then the data, whose offsets count from the end of the header.
struct safetensors_bytes {
  nlohmann::json header;
  std::string data;
};
safetensors_bytes read_safetensors(fs::path const& path) {
  std::ifstream in(path, std::ios::binary);
  std::string const bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() >= 8);
  std::uint64_t length = 0;
  for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<unsigned char>(bytes[static_cast<std::size_t>(i)]);
  REQUIRE(8 + length <= bytes.size());
  return {nlohmann::json::parse(bytes.substr(8, length)), bytes.substr(8 + length)};
}
void write_safetensors(fs::path const& path, safetensors_bytes const& f) {
  std::string header = f.header.dump();
  header.append((8 - header.size() % 8) % 8, ' ');  // the data stays 8-byte aligned
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  for (int i = 0; i < 8; ++i) out.put(static_cast<char>(header.size() >> (8 * i) & 0xff));
  out << header << f.data;
}

template <class Plan = tp_plan>
void load_at(int ranks, models::LlamaConfig const& c, fs::path const& dir, sw::load_options const& options = {}) {
  sw::run_threads(ranks, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
    models::Llama<float, Plan> model(c);
    sw::parallelize(model, tp);
    (void)sw::load_sharded(model, tp, dir, options);
  });
}

}  // namespace

TEST_CASE("the layout on disk: rank folders, the index, and names after the model's layers") {
  scratch_dir dir("layout");
  auto const c = config();
  save_at<tp_plan>(2, c, dir.path / "ckpt", 7);
  CHECK(fs::exists(dir.path / "ckpt/tensor_parallel_shards/tp_rank_00_pp_rank_00/model.safetensors"));
  CHECK(fs::exists(dir.path / "ckpt/tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors"));
  CHECK(!fs::exists(dir.path / "ckpt/tensor_parallel_shards/tp_rank_02_pp_rank_00"));
  CHECK(!fs::exists(dir.path / ".ckpt.incomplete"));
  auto const index = sw::read_checkpoint_index(dir.path / "ckpt");
  CHECK(index.tp == 2);
  CHECK(index.step == 7);
  // Shapes, placements and pieces as the Llama plan cuts them (dim 32, hidden 64, 2 x 8 key-value rows).
  auto const* wq = index.find("layers.1.attention.wq.weight");
  REQUIRE(wq);
  CHECK(wq->shape == std::vector<std::uint64_t>{32, 32});
  CHECK(wq->placement == "Shard(dim=0)");
  REQUIRE(wq->pieces.size() == 2);
  CHECK(wq->pieces[1].file == "tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors");
  CHECK(wq->pieces[1].offset == std::vector<std::uint64_t>{16, 0});
  auto const* wo = index.find("layers.0.attention.wo.weight");
  REQUIRE(wo);
  CHECK(wo->placement == "Shard(dim=1)");
  CHECK(wo->pieces[1].offset == std::vector<std::uint64_t>{0, 16});
  auto const* wk = index.find("layers.0.attention.wk.weight");
  REQUIRE(wk);
  CHECK(wk->shape == std::vector<std::uint64_t>{16, 32});
  auto const* norm = index.find("norm.weight");
  REQUIRE(norm);
  CHECK(norm->placement == "Replicate()");
  CHECK(norm->pieces.size() == 1);  // saved once, by tp rank 0
  CHECK(index.find("tok_embeddings.weight")->shape == std::vector<std::uint64_t>{62, 32});
  CHECK(index.find("output.weight")->shape == std::vector<std::uint64_t>{62, 32});
  CHECK(!index.find("output.bias"));         // bias-free layers save no bias
  CHECK(index.tensors.size() == 3 + 2 * 9);  // embeddings, norm, output; per block 2 norms and 7 projections
  // Each rank's file is a plain safetensors file.
  sw::safetensors_file rank1(
      (dir.path / "ckpt/tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors").string());
  CHECK(rank1.info("layers.0.feed_forward.w1.weight").shape == std::vector<std::uint64_t>{32, 32});
  CHECK(!rank1.contains("norm.weight"));
}

TEST_CASE("round trips at TP 1, 2 and 4: the same parameters and outputs after loading") {
  auto const c = config();
  auto const expected = reference(c);
  for (int tp : {1, 2, 4}) {
    scratch_dir dir("roundtrip" + std::to_string(tp));
    save_at<tp_plan>(tp, c, dir.path / "ckpt", tp);
    load_and_check<tp_plan>(tp, c, dir.path / "ckpt", expected, tp);
  }
}

TEST_CASE("resharding: saved at TP 4, loaded at TP 2 and 1, and the reverse, with sequence parallelism too") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("reshard");
  save_at<tp_plan>(4, c, dir.path / "tp4", 40);  // padded vocabulary, repeated key-value heads
  load_and_check<tp_plan>(2, c, dir.path / "tp4", expected, 40);
  load_and_check<tp_plan>(1, c, dir.path / "tp4", expected, 40);
  load_and_check<sequence_plan>(2, c, dir.path / "tp4", expected, 40);
  save_at<tp_plan>(1, c, dir.path / "tp1", 10);
  load_and_check<tp_plan>(4, c, dir.path / "tp1", expected, 10);
  load_and_check<tp_plan>(2, c, dir.path / "tp1", expected, 10);
  save_at<sequence_plan>(2, c, dir.path / "sp2", 20);
  load_and_check<tp_plan>(4, c, dir.path / "sp2", expected, 20);
  // A column-cut tensor is staged a few rows at a time: down to one row per read, the same parameters.
  for (std::size_t staging : {std::size_t{1}, std::size_t{100}}) {
    INFO("staging " << staging << " bytes");
    sw::detail::load_staging_bytes = staging;
    load_and_check<tp_plan>(2, c, dir.path / "tp4", expected, 40);
    load_and_check<tp_plan>(4, c, dir.path / "tp1", expected, 10);
  }
  sw::detail::load_staging_bytes = std::size_t{4} << 20;
}

TEST_CASE("saving again replaces the checkpoint; a folder that is not a checkpoint is refused") {
  auto const c = config();
  auto const other = config(77);
  scratch_dir dir("replace");
  save_at<tp_plan>(2, other, dir.path / "ckpt", 1);
  save_at<tp_plan>(4, c, dir.path / "ckpt", 2);  // over the previous one, at another TP size
  load_and_check<tp_plan>(2, c, dir.path / "ckpt", reference(c), 2);
  CHECK(fs::exists(dir.path / "ckpt/tensor_parallel_shards/tp_rank_03_pp_rank_00"));
  for (auto const& entry : fs::directory_iterator(dir.path))  // nothing left beside it but the savers' lock
    CHECK_MESSAGE((entry.path().filename() == "ckpt" || entry.path().filename() == ".ckpt.lock"), entry.path());

  fs::create_directories(dir.path / "photos");
  std::ofstream(dir.path / "photos/cat.jpg") << "meow";
  check_error([&] { save_at<tp_plan>(2, c, dir.path / "photos", 3); },
              {"photos", "exists and is not a shardwise checkpoint"});
  CHECK(fs::exists(dir.path / "photos/cat.jpg"));
}

TEST_CASE("the model's configuration is saved beside the weights; a load into another one is refused by field") {
  auto const c = config();
  scratch_dir dir("config");
  save_at<tp_plan>(2, c, dir.path / "ckpt", 1);
  CHECK(sw::read_checkpoint_index(dir.path / "ckpt").config.at("rope_theta") == "10000");
  auto other_theta = c;
  other_theta.rope_theta = 500000;
  check_error([&] { load_at(2, other_theta, dir.path / "ckpt"); },
              {"shardwise_checkpoint.json",
               "the checkpoint was saved from a model with rope_theta = 10000 but this "
               "model has rope_theta = 500000; build the model with the checkpoint's "
               "configuration"});
  auto other_heads = c;  // 2 query heads of width 16 and 1 key-value head: every tensor has the same shape
  other_heads.heads = 2, other_heads.kv_heads = 1;
  check_error([&] { load_at(1, other_heads, dir.path / "ckpt"); },
              {"saved from a model with heads = 4 but this model has heads = 2"});
  load_at(2, c, dir.path / "ckpt");  // the same configuration loads
}

TEST_CASE("bad checkpoints: an error naming the file, the tensor and the fix") {
  auto const c = config();
  scratch_dir dir("bad");
  fs::path const ckpt = dir.path / "ckpt";
  save_at<tp_plan>(2, c, ckpt, 5);

  SUBCASE("a missing rank folder") {
    fs::remove_all(ckpt / "tensor_parallel_shards/tp_rank_01_pp_rank_00");
    check_error([&] { load_at(1, c, ckpt); },
                {"tp_rank_01_pp_rank_00/model.safetensors", "is missing", "is gone", "restore it"});
    check_error([&] { load_at(2, c, ckpt); }, {"tp_rank_01_pp_rank_00", "is gone"});
  }
  SUBCASE("a tensor the checkpoint lacks (a model with more layers)") {
    check_error([&] { load_at(2, config(1234, 3), ckpt); },
                {"shardwise_checkpoint.json", "the model's tensor \"layers.2.attention_norm.weight\"",
                 "is not in the checkpoint"});
  }
  SUBCASE("a tensor the model lacks (a model with fewer layers)") {
    check_error([&] { load_at(2, config(1234, 1), ckpt); },
                {"shardwise_checkpoint.json", "the checkpoint's tensor \"layers.1.attention_norm.weight\"",
                 "is not in the model"});
  }
  SUBCASE("a tensor of another shape (another hidden size)") {
    check_error([&] { load_at(1, config(1234, 2, 96), ckpt); },
                {"shardwise_checkpoint.json", "tensor \"layers.0.feed_forward.w1.weight\"",
                 "has shape [64, 32] in the checkpoint but [96, 32] in the model", "same model configuration"});
  }
  SUBCASE("no index, or an index that is not JSON") {
    check_error([&] { load_at(1, c, dir.path / "nothing"); },
                {"nothing/shardwise_checkpoint.json", "not a complete shardwise checkpoint"});
    std::ofstream(ckpt / "shardwise_checkpoint.json", std::ios::trunc) << "{\"format\": ";
    check_error([&] { load_at(1, c, ckpt); }, {"shardwise_checkpoint.json", "is not valid JSON"});
  }
  SUBCASE("a rank file cut short") {
    fs::path const shard = ckpt / "tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors";
    // The tensors whose bytes the cut removes (at least in part): the error must name one of them.
    auto const file = read_safetensors(shard);
    std::vector<std::string> cut;
    for (auto const& [name, info] : file.header.items())
      if (name != "__metadata__" && info.at("data_offsets")[1].get<std::size_t>() > file.data.size() - 100)
        cut.push_back("tensor \"" + name + "\"");
    REQUIRE(!cut.empty());
    fs::resize_file(shard, fs::file_size(shard) - 100);
    auto const names_a_cut_tensor = [&](std::string const& message) {
      return std::any_of(cut.begin(), cut.end(), [&](auto const& t) { return message.find(t) != std::string::npos; });
    };
    auto message = check_error([&] { load_at(2, c, ckpt); }, {"tp_rank_01_pp_rank_00/model.safetensors", "truncated"});
    CHECK_MESSAGE(names_a_cut_tensor(message), message);
    // Reading in turns: the failing rank's words reach every rank, and none waits forever at a turn.
    message = check_error([&] { load_at(4, c, ckpt, {.ranks_per_step = 1}); },
                          {"tp_rank_01_pp_rank_00/model.safetensors", "truncated"});
    CHECK_MESSAGE(names_a_cut_tensor(message), message);
  }
  SUBCASE("a rank file whose tensor has another shape than the index says") {
    fs::path const shard = ckpt / "tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors";
    auto file = read_safetensors(shard);
    REQUIRE(file.header.at("layers.0.attention.wq.weight").at("shape") == nlohmann::json{16, 32});
    file.header["layers.0.attention.wq.weight"]["shape"] = {32, 16};  // as many bytes, another shape
    write_safetensors(shard, file);
    for (bool rank0_reads : {false, true}) {
      INFO("only_rank0_reads " << rank0_reads);
      check_error([&] { load_at(2, c, ckpt, {.only_rank0_reads = rank0_reads}); },
                  {"tp_rank_01_pp_rank_00/model.safetensors", "tensor \"layers.0.attention.wq.weight\"",
                   "has shape [32, 16] but the index says [16, 32]", "save it again"});
    }
  }
}

TEST_CASE("a corrupt index: an error naming the index file, the tensor and the fix") {
  auto const c = config();
  scratch_dir dir("bad_index");
  fs::path const ckpt = dir.path / "ckpt";
  save_at<tp_plan>(2, c, ckpt, 5);
  std::string const index_file = "ckpt/shardwise_checkpoint.json\"";
  std::string const wq = "layers.0.attention.wq.weight";  // 32 x 32, rows [0, 16) at tp rank 0, [16, 32) at 1
  auto const rank_file = [](int r) {
    return "tensor_parallel_shards/tp_rank_0" + std::to_string(r) + "_pp_rank_00/model.safetensors";
  };
  edit_index(ckpt, [&](nlohmann::json& index) {  // the pieces as this test expects them
    REQUIRE(entry(index, wq).at("pieces").size() == 2);
    CHECK(entry(index, wq).at("pieces")[1].at("offset") == nlohmann::json{16, 0});
    CHECK(entry(index, wq).at("pieces")[1].at("file") == rank_file(1));
  });

  SUBCASE("nested deeper than an index, or a FIFO in its place: refused before parsing, never waited on") {
    fs::path const file = ckpt / "shardwise_checkpoint.json";
    std::ofstream(file, std::ios::trunc) << "{\"tensors\": " << std::string(100000, '[') << std::string(100000, ']')
                                         << "}";
    check_error([&] { load_at(1, c, ckpt); }, {index_file, "nests JSON 65 deep, deeper than an index does"});
    fs::remove(file);
    REQUIRE(::mkfifo(file.c_str(), 0600) == 0);
    check_error([&] { load_at(1, c, ckpt); }, {"shardwise_checkpoint.json\" is not a regular file"});
  }
  SUBCASE("a shape of more than 2^64 elements") {
    edit_index(ckpt, [&](nlohmann::json& index) {
      entry(index, wq)["shape"] = {std::uint64_t{1} << 40, std::uint64_t{1} << 40};
    });
    check_error([&] { load_at(1, c, ckpt); },
                {index_file, "tensor \"" + wq + "\"", "its shape holds more than 2^64 elements"});
  }
  SUBCASE("a tp size beyond int, which would wrap to 2") {
    edit_index(ckpt, [&](nlohmann::json& index) { index["mesh"]["tp"] = (std::int64_t{1} << 32) + 2; });
    check_error([&] { load_at(1, c, ckpt); },
                {index_file, "has a mesh whose tp size is 4294967298, outside 1..1048576"});
  }
  // Numbers that are not sizes where sizes belong: converting them would be undefined behaviour (the fuzzer's
  // finding: "tp": 22E22), so each is refused by name.
  SUBCASE("a mesh size of 2.2e23") {
    edit_index(ckpt, [&](nlohmann::json& index) { index["mesh"]["tp"] = 2.2e23; });
    check_error([&] { load_at(1, c, ckpt); },
                {index_file, "has a mesh size 2.2e+23, which is not a 64-bit integer", "save it again"});
  }
  SUBCASE("a negative offset") {
    edit_index(ckpt, [&](nlohmann::json& index) { entry(index, wq)["pieces"][1]["offset"] = {-16, 0}; });
    check_error([&] { load_at(1, c, ckpt); }, {index_file, "has an offset -16, which is not an integer >= 0"});
  }
  SUBCASE("a fractional shape") {
    edit_index(ckpt, [&](nlohmann::json& index) { entry(index, wq)["shape"] = {32.5, 32}; });
    check_error([&] { load_at(1, c, ckpt); }, {index_file, "has a tensor's shape 32.5, which is not an integer >= 0"});
  }
  SUBCASE("a step of 1e300") {
    edit_index(ckpt, [&](nlohmann::json& index) { index["step"] = 1e300; });
    check_error([&] { load_at(1, c, ckpt); }, {index_file, "has step 1e+300, which is not a 64-bit integer"});
  }
  SUBCASE("a piece's folder numbered past int") {
    std::string const far = "tensor_parallel_shards/tp_rank_99999999999_pp_rank_00/model.safetensors";
    edit_index(ckpt, [&](nlohmann::json& index) { entry(index, wq)["pieces"][1]["file"] = far; });
    check_error([&] { load_at(1, c, ckpt); }, {far});
  }
  SUBCASE("pieces that overlap") {
    edit_index(ckpt, [&](nlohmann::json& index) { entry(index, wq)["pieces"][1]["offset"] = {8, 0}; });
    check_error([&] { load_at(1, c, ckpt); },
                {index_file, "tensor \"" + wq + "\"", rank_file(0) + "\" and \"" + rank_file(1) + "\" overlap",
                 "save the checkpoint again"});
  }
  SUBCASE("pieces that leave a hole") {
    edit_index(ckpt, [&](nlohmann::json& index) { entry(index, wq)["pieces"].erase(1); });
    check_error([&] { load_at(1, c, ckpt); }, {index_file, "tensor \"" + wq + "\"", "its pieces hold 512 of its 1024",
                                               "a rank's shard is missing: save the checkpoint again"});
  }
  SUBCASE("a piece beyond the tensor") {
    edit_index(ckpt, [&](nlohmann::json& index) { entry(index, wq)["pieces"][1]["offset"] = {24, 0}; });
    check_error([&] { load_at(1, c, ckpt); }, {index_file, "tensor \"" + wq + "\"", rank_file(1),
                                               "reaches beyond the tensor in dimension 0", "save it again"});
  }
  SUBCASE("an unknown dtype") {
    edit_index(ckpt, [&](nlohmann::json& index) { entry(index, "norm.weight")["dtype"] = "F8_E4M3"; });
    check_error(
        [&] { load_at(1, c, ckpt); },
        {index_file, "tensor \"norm.weight\" has dtype \"F8_E4M3\", which shardwise does not read", "save it again"});
  }
  SUBCASE("a tensor listed twice") {
    edit_index(ckpt, [&](nlohmann::json& index) { index["tensors"].push_back(entry(index, "norm.weight")); });
    check_error([&] { load_at(1, c, ckpt); }, {index_file, "lists tensor \"norm.weight\" twice", "save it again"});
  }
  SUBCASE("a piece outside the checkpoint folder") {
    for (std::string const outside : {"../x", "tensor_parallel_shards/../../x", "/etc/passwd"}) {
      INFO(outside);
      edit_index(ckpt, [&](nlohmann::json& index) { entry(index, "norm.weight")["pieces"][0]["file"] = outside; });
      check_error(
          [&] { load_at(1, c, ckpt); },
          {index_file, "tensor \"norm.weight\" names the file \"" + outside + "\" outside the checkpoint folder",
           "save it again"});
    }
  }
  SUBCASE("a mesh that disagrees with the pieces") {
    edit_index(ckpt, [&](nlohmann::json& index) { index["mesh"]["tp"] = 1; });  // saved at TP 2
    check_error([&] { load_at(1, c, ckpt); },
                {index_file, "tensor \"tok_embeddings.weight\" has a piece in \"" + rank_file(1),
                 "of tp rank 1 and pp rank 0, outside the index's mesh of tp 1 x pp 1",
                 "the mesh and the pieces disagree", "save it again"});
  }
}

namespace {
char const* kill_stage = "";  // set in the child before its rank threads start; read-only afterwards

void kill_now(std::string_view stage, int) {
  if (stage == kill_stage) ::raise(SIGKILL);  // the whole process: every rank thread dies with it
}

/// Runs a save of `c` at TP 2 into `dir` in a child process that SIGKILLs itself at `stage`.
void save_killed_at(char const* stage, models::LlamaConfig const& c, fs::path const& dir) {
  pid_t const child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    kill_stage = stage;
    sw::detail::checkpoint_save_hook = kill_now;
    try {
      save_at<tp_plan>(2, c, dir, 99);
    } catch (...) {
      ::_exit(3);
    }
    ::_exit(0);  // not killed: the parent's check fails
  }
  int status = 0;
  REQUIRE(::waitpid(child, &status, 0) == child);
  CHECK_MESSAGE(WIFSIGNALED(status), "the child was not killed (status " << status << ")");
  if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == SIGKILL);
}
}  // namespace

/// The staging folders of saves in `parent` (".ckpt.incomplete.<generation>"), finished or not.
std::vector<fs::path> staging_folders(fs::path const& parent) {
  std::vector<fs::path> found;
  for (auto const& entry : fs::directory_iterator(parent))
    if (entry.path().filename().string().rfind(".ckpt.incomplete", 0) == 0) found.push_back(entry.path());
  return found;
}

TEST_CASE("a save killed midway (SIGKILL) leaves the previous checkpoint loadable") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("killed");
  fs::path const ckpt = dir.path / "ckpt";
  save_at<tp_plan>(2, c, ckpt, 5);
  for (char const* stage : {"rank_file_written", "before_commit"}) {
    INFO("killed at " << stage);
    save_killed_at(stage, config(4321), ckpt);  // other weights, never committed
    CHECK(!staging_folders(dir.path).empty());  // the dead save's folder, beside the checkpoint
    load_and_check<tp_plan>(2, c, ckpt, expected, 5);
    load_and_check<tp_plan>(4, c, ckpt, expected, 5);
  }
  // The next save clears what the dead one left and commits.
  save_at<tp_plan>(4, c, ckpt, 6);
  CHECK(staging_folders(dir.path).empty());
  load_and_check<tp_plan>(1, c, ckpt, expected, 6);
}

namespace {
fs::path tampered_save;                          // the checkpoint folder being saved
std::function<void(safetensors_bytes&)> tamper;  // applied to tp rank 1's file once it is written

/// A rank that wrote a wrong file: tp rank 1's file is edited after it is written, before tp rank 0 reopens every
/// rank's file to check the cover (the save's own hook, at the stage the save calls it).
void tamper_with_rank1(std::string_view stage, int tp_rank) {
  if (stage != "rank_file_written" || tp_rank != 1) return;
  auto const staging = staging_folders(tampered_save.parent_path());
  REQUIRE(staging.size() == 1);
  fs::path const file = staging.front() / "tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors";
  auto f = read_safetensors(file);
  tamper(f);
  write_safetensors(file, f);
}
}  // namespace

TEST_CASE("the cover check at save time: shards that miss or repeat part of a tensor fail the save, not the last one") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("cover");
  fs::path const ckpt = dir.path / "ckpt";
  save_at<tp_plan>(2, c, ckpt, 5);
  std::string const wq = "layers.0.attention.wq.weight";  // 32 x 32, rows [16, 32) at tp rank 1
  std::string words;
  SUBCASE("a tensor's rows saved twice") {
    tamper = [&](safetensors_bytes& f) {
      auto& header = f.header;
      auto offsets = nlohmann::json::parse(header.at("__metadata__").at("shardwise.offsets").get<std::string>());
      REQUIRE(offsets.at(wq) == nlohmann::json{16, 0});
      offsets[wq] = {8, 0};  // rows [8, 24): half of them are rank 0's too
      header["__metadata__"]["shardwise.offsets"] = offsets.dump();
    };
    words = "overlap; each element must be saved once";
  }
  SUBCASE("a tensor's rows not saved") {
    tamper = [&](safetensors_bytes& f) {  // the tensor and its bytes taken out, the bytes after it moved up
      auto const range = f.header.at(wq).at("data_offsets").get<std::vector<std::size_t>>();
      f.data.erase(range[0], range[1] - range[0]);
      f.header.erase(wq);
      for (auto& [name, info] : f.header.items())
        if (name != "__metadata__" && info.at("data_offsets")[0].get<std::size_t>() >= range[1])
          for (auto& at : info["data_offsets"]) at = at.get<std::size_t>() - (range[1] - range[0]);
    };
    words = "its pieces hold 512 of its 1024 elements; a rank's shard is missing";
  }
  tampered_save = ckpt;
  sw::detail::checkpoint_save_hook = tamper_with_rank1;
  check_error([&] { save_at<tp_plan>(2, config(4321), ckpt, 6); },
              {".ckpt.incomplete.", "tensor \"" + wq + "\"", words, "save the checkpoint again"});
  sw::detail::checkpoint_save_hook = nullptr;
  CHECK(!fs::exists(dir.path / ".ckpt.incomplete"));
  load_and_check<tp_plan>(2, c, ckpt, expected, 5);  // the last good checkpoint, untouched
}

TEST_CASE(
    "without RENAME_EXCHANGE: the previous checkpoint is moved aside, and a save killed then leaves it loadable") {
  struct fallback {
    fallback() { sw::detail::checkpoint_without_exchange = true; }
    ~fallback() { sw::detail::checkpoint_without_exchange = false; }
  } const forced;  // inherited by the forked child below
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("no_exchange");
  fs::path const ckpt = dir.path / "ckpt";
  save_at<tp_plan>(2, config(77), ckpt, 1);
  save_at<tp_plan>(2, c, ckpt, 2);  // replaces it through the two renames
  load_and_check<tp_plan>(2, c, ckpt, expected, 2);
  for (auto const& entry : fs::directory_iterator(dir.path))  // nothing left beside it but the savers' lock
    CHECK_MESSAGE((entry.path().filename() == "ckpt" || entry.path().filename() == ".ckpt.lock"), entry.path());

  save_killed_at("previous_moved_aside", config(4321), ckpt);  // between the two renames
  CHECK(!fs::exists(ckpt));
  CHECK(fs::exists(dir.path / ".ckpt.previous/shardwise_checkpoint.json"));
  load_and_check<tp_plan>(2, c, ckpt, expected, 2);
  load_and_check<tp_plan>(4, c, ckpt, expected, 2);

  save_at<tp_plan>(2, c, ckpt, 3);  // the next save commits and clears what the dead one left
  load_and_check<tp_plan>(1, c, ckpt, expected, 3);
  for (auto const& entry : fs::directory_iterator(dir.path))  // nothing left beside it but the savers' lock
    CHECK_MESSAGE((entry.path().filename() == "ckpt" || entry.path().filename() == ".ckpt.lock"), entry.path());
}

TEST_CASE("a lazily declared model is filled with its shard only") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("lazy");
  save_at<tp_plan>(2, c, dir.path / "ckpt", 8);
  sw::run_threads(4, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
    sw::Lazy<models::Llama<float, tp_plan>> lazy(c);
    sw::parallelize(lazy, tp);
    auto& model = sw::load_sharded(lazy, tp, dir.path / "ckpt");
    CHECK(model.layers[0].feed_forward.w1.weight.rows() == 64 / 4);  // this rank's shard, never the whole
    CHECK(model.tok_embeddings.weight.rows() == 64 / 4);             // 62 padded to 64, cut in 4
    auto const parameters = full_parameters(model, tp, c.vocabulary);
    auto const logits = full_logits(model, tp, some_ids(c), c.vocabulary);
    if (world.rank() != 0) return;
    CHECK(parameters == expected.parameters);
    CHECK((logits - expected.logits).cwiseAbs().maxCoeff() <= 1e-5f * expected.logits.cwiseAbs().maxCoeff());
  });
}

namespace {
std::atomic<int> reading{0}, most_reading{0}, began_reading{0};
void count_readers(std::string_view stage, int) {
  if (stage == "read_begin") {
    ++began_reading;
    int const now = ++reading;
    int seen = most_reading.load();
    while (now > seen && !most_reading.compare_exchange_weak(seen, now)) {
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));  // without turns, the ranks would overlap here
  } else {
    --reading;
  }
}
}  // namespace

/// Loads the checkpoint `ckpt` on four threads as dp (4 / tp_size) x tp_size, each rank with options_of(world),
/// counting its readers: every rank's parameters must be `expected`'s. Returns the most that read at once.
template <class OptionsOf>
int most_readers_loading(fs::path const& ckpt, Reference const& expected, int tp_size, OptionsOf&& options_of) {
  auto const c = config();
  most_reading = 0, began_reading = 0;
  sw::detail::checkpoint_load_hook = count_readers;
  std::vector<std::vector<std::vector<float>>> loaded(4);
  sw::run_threads(4, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"dp", "tp">(world, {4 / tp_size, tp_size}));
    models::Llama<float, tp_plan> model(config(555));
    sw::parallelize(model, tp);
    (void)sw::load_sharded(model, tp, ckpt, options_of(world));
    loaded[static_cast<std::size_t>(world.rank())] = full_parameters(model, tp, c.vocabulary);
  });
  sw::detail::checkpoint_load_hook = nullptr;
  for (auto const& got : loaded) CHECK(got == expected.parameters);
  return most_reading.load();
}

TEST_CASE("ranks_per_step: at most that many ranks read at once") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("turns");
  save_at<tp_plan>(4, c, dir.path / "ckpt", 9);
  for (int per_step : {0, 1, 2}) {
    INFO("ranks_per_step " << per_step);
    int const most = most_readers_loading(dir.path / "ckpt", expected, 4,
                                          [&](auto&) { return sw::load_options{.ranks_per_step = per_step}; });
    if (per_step == 0)
      CHECK(most >= 2);  // all at once: they overlap (what the turns must prevent)
    else
      CHECK(most <= per_step);
  }
}

TEST_CASE("ranks_per_step over the node (sw::node_turns): at most that many of its ranks read, across replicas") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("node_turns");
  save_at<tp_plan>(2, c, dir.path / "ckpt", 9);
  for (bool per_node : {false, true}) {
    INFO((per_node ? "turns over the node" : "turns over each tp group"));
    int const most = most_readers_loading(dir.path / "ckpt", expected, 2, [&](auto& world) {  // two replicas
      sw::load_options options{.ranks_per_step = 1};
      if (per_node) options.turns = sw::node_turns(world);  // one node: the four threads
      return options;
    });
    if (per_node)
      CHECK(most == 1);
    else
      CHECK(most >= 2);  // a rank of each replica at once: what per-node turns prevent
  }
}

TEST_CASE("only_rank0_reads over the node (sw::node_turns): its first rank alone reads, for every replica") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("node_reader");
  fs::path const ckpt = dir.path / "ckpt";
  save_at<tp_plan>(2, c, ckpt, 9);
  auto const options_of = [](bool per_node) {
    return [per_node](auto& world) {
      sw::load_options options{.only_rank0_reads = true};
      if (per_node) options.turns = sw::node_turns(world);  // one node: the four threads
      return options;
    };
  };
  for (int tp_size : {2, 4}) {  // two replicas of tp 2; one tp group of 4 loading a tp 2 save (padded, cut again)
    for (bool per_node : {false, true}) {
      INFO("tp " << tp_size << (per_node ? ", one reader for the node" : ", one reader per tp group"));
      (void)most_readers_loading(ckpt, expected, tp_size, options_of(per_node));
      CHECK(began_reading.load() == (per_node || tp_size == 4 ? 1 : 2));
    }
  }
  // A rank file cut short: the node's reader finds it, and every rank raises its words (none waits for a block).
  fs::path const shard = ckpt / "tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  std::vector<std::string> messages(4);
  sw::run_threads(4, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"dp", "tp">(world, {2, 2}));
    models::Llama<float, tp_plan> model(config(555));
    sw::parallelize(model, tp);
    try {
      (void)sw::load_sharded(model, tp, ckpt, options_of(true)(world));
    } catch (sw::error const& e) {
      messages[static_cast<std::size_t>(world.rank())] = e.what();
    }
  });
  for (auto const& message : messages) {
    CHECK_MESSAGE(message.find("tp_rank_01_pp_rank_00/model.safetensors") != std::string::npos, message);
    CHECK_MESSAGE(message.find("truncated") != std::string::npos, message);
  }
}

TEST_CASE("a consolidated file (shardwise's or Hugging Face's names) loaded at any TP size, each rank slicing it") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("consolidated");
  save_at<tp_plan>(2, c, dir.path / "ckpt", 4);
  sw::consolidate(dir.path / "ckpt", dir.path / "model.safetensors");
  sw::consolidate_options hf;
  hf.mapping = sw::transformers_llama_mapping();
  sw::consolidate(dir.path / "ckpt", dir.path / "hf.safetensors", hf);
  for (int ranks : {1, 2, 4}) {
    INFO("TP " << ranks);
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      models::Llama<float, tp_plan> model(config(555));
      sw::parallelize(model, tp);
      auto const metadata = sw::load_consolidated(model, tp, dir.path / "model.safetensors");
      auto const parameters = full_parameters(model, tp, c.vocabulary);
      sw::Lazy<models::Llama<float, sequence_plan>> lazy(c);
      sw::parallelize(lazy, tp);
      auto& from_hf = sw::load_consolidated(lazy, tp, dir.path / "hf.safetensors", sw::transformers_llama_name);
      auto const hf_parameters = full_parameters(from_hf, tp, c.vocabulary);
      auto const logits = full_logits(from_hf, tp, some_ids(c), c.vocabulary);
      if (world.rank() != 0) return;
      CHECK(metadata.at("shardwise.step") == "4");
      CHECK(parameters == expected.parameters);
      CHECK(hf_parameters == expected.parameters);
      CHECK((logits - expected.logits).cwiseAbs().maxCoeff() <= 1e-5f * expected.logits.cwiseAbs().maxCoeff());
    });
  }
  auto const load_file = [&](models::LlamaConfig const& config, fs::path const& file) {
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
      models::Llama<float, tp_plan> model(config);
      sw::parallelize(model, tp);
      (void)sw::load_consolidated(model, tp, file);
    });
  };
  check_error([&] { load_file(llama_config_with_layers(3), dir.path / "model.safetensors"); },
              {"shardwise::load_consolidated", "model.safetensors",
               "the model's tensor \"layers.2.attention_norm.weight\"", "is not in the checkpoint"});
  check_error([&] { load_file(c, dir.path / "hf.safetensors"); },
              {"shardwise::load_consolidated", "hf.safetensors", "\"tok_embeddings.weight\" is not in the checkpoint"});
  check_error([&] { load_file(c, dir.path / "missing.safetensors"); }, {"missing.safetensors", "cannot open"});
}

namespace {
std::atomic<int> readers{0};
void count_reading_ranks(std::string_view stage, int) {
  if (stage == "read_begin") ++readers;
}
}  // namespace

TEST_CASE("only_rank0_reads: rank 0 reads, the others receive their shards over the mesh") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("rank0");
  save_at<tp_plan>(2, c, dir.path / "ckpt", 13);  // loaded at TP 4: padded vocabulary, repeated heads
  sw::detail::checkpoint_load_hook = count_reading_ranks;
  for (int ranks : {4, 2}) {
    INFO("TP " << ranks);
    readers = 0;
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      sw::Lazy<models::Llama<float, sequence_plan>> lazy(c);
      sw::parallelize(lazy, tp);
      auto& model = sw::load_sharded(lazy, tp, dir.path / "ckpt", {.only_rank0_reads = true});
      auto const parameters = full_parameters(model, tp, c.vocabulary);
      auto const logits = full_logits(model, tp, some_ids(c), c.vocabulary);
      if (world.rank() != 0) return;
      CHECK(parameters == expected.parameters);
      CHECK((logits - expected.logits).cwiseAbs().maxCoeff() <= 1e-5f * expected.logits.cwiseAbs().maxCoeff());
    });
    CHECK(readers.load() == 1);
  }
  sw::detail::checkpoint_load_hook = nullptr;
  // A rank file cut short: rank 0's error reaches every rank (none waits for a shard that never comes).
  fs::path const shard = dir.path / "ckpt/tensor_parallel_shards/tp_rank_01_pp_rank_00/model.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  check_error([&] { load_at(4, c, dir.path / "ckpt", {.only_rank0_reads = true}); },
              {"tp_rank_01_pp_rank_00/model.safetensors", "truncated"});
}
