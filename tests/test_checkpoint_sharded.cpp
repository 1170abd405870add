// Sharded checkpoints of the Llama model on the thread mesh: round trips at TP 1, 2, 4; saved at one TP size and
// loaded at another (parameters bit for bit, forward outputs against the unsharded model); bad checkpoints with
// the words of their errors; a save killed (SIGKILL, in a child process) leaves the previous checkpoint loadable.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/llama_names.hpp>
#include <shardwise/checkpoint/sharded.hpp>
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

template <class Fn>
void check_error(Fn&& fn, std::initializer_list<std::string> words) {
  bool thrown = false;
  try {
    fn();
  } catch (sw::error const& e) {
    thrown = true;
    std::string const message = e.what();
    CHECK_MESSAGE(message.rfind("shardwise::", 0) == 0, message);
    for (auto const& w : words)
      CHECK_MESSAGE(message.find(w) != std::string::npos, "missing \"" << w << "\" in: " << message);
  }
  CHECK_MESSAGE(thrown, "no shardwise::error was thrown");
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
  CHECK(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()) == 1);  // nothing left beside

  fs::create_directories(dir.path / "photos");
  std::ofstream(dir.path / "photos/cat.jpg") << "meow";
  check_error([&] { save_at<tp_plan>(2, c, dir.path / "photos", 3); },
              {"photos", "exists and is not a shardwise checkpoint"});
  CHECK(fs::exists(dir.path / "photos/cat.jpg"));
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
    fs::resize_file(shard, fs::file_size(shard) - 100);
    check_error([&] { load_at(2, c, ckpt); }, {"tp_rank_01_pp_rank_00/model.safetensors", "truncated"});
    // Reading in turns: the failing rank's words reach every rank, and none waits forever at a turn.
    check_error([&] { load_at(4, c, ckpt, {.ranks_per_step = 1}); },
                {"tp_rank_01_pp_rank_00/model.safetensors", "truncated"});
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

TEST_CASE("a save killed midway (SIGKILL) leaves the previous checkpoint loadable") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("killed");
  fs::path const ckpt = dir.path / "ckpt";
  save_at<tp_plan>(2, c, ckpt, 5);
  for (char const* stage : {"rank_file_written", "before_commit"}) {
    INFO("killed at " << stage);
    save_killed_at(stage, config(4321), ckpt);         // other weights, never committed
    CHECK(fs::exists(dir.path / ".ckpt.incomplete"));  // the dead save's folder, beside the checkpoint
    load_and_check<tp_plan>(2, c, ckpt, expected, 5);
    load_and_check<tp_plan>(4, c, ckpt, expected, 5);
  }
  // The next save clears what the dead one left and commits.
  save_at<tp_plan>(4, c, ckpt, 6);
  CHECK(!fs::exists(dir.path / ".ckpt.incomplete"));
  load_and_check<tp_plan>(1, c, ckpt, expected, 6);
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
std::atomic<int> reading{0}, most_reading{0};
void count_readers(std::string_view stage, int) {
  if (stage == "read_begin") {
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

TEST_CASE("ranks_per_step: at most that many ranks read at once") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("turns");
  save_at<tp_plan>(4, c, dir.path / "ckpt", 9);
  sw::detail::checkpoint_load_hook = count_readers;
  for (int per_step : {0, 1, 2}) {
    INFO("ranks_per_step " << per_step);
    most_reading = 0;
    std::vector<std::vector<std::vector<float>>> loaded(4);
    sw::run_threads(4, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
      models::Llama<float, tp_plan> model(config(555));
      sw::parallelize(model, tp);
      (void)sw::load_sharded(model, tp, dir.path / "ckpt", {.ranks_per_step = per_step});
      loaded[static_cast<std::size_t>(world.rank())] = full_parameters(model, tp, c.vocabulary);
    });
    if (per_step == 0)
      CHECK(most_reading.load() >= 2);  // all at once: they overlap (what the turns must prevent)
    else
      CHECK(most_reading.load() <= per_step);
    for (auto const& got : loaded) CHECK(got == expected.parameters);
  }
  sw::detail::checkpoint_load_hook = nullptr;
}

TEST_CASE("a consolidated file (shardwise's or Hugging Face's names) loaded at any TP size, each rank slicing it") {
  auto const c = config();
  auto const expected = reference(c);
  scratch_dir dir("consolidated");
  save_at<tp_plan>(2, c, dir.path / "ckpt", 4);
  sw::consolidate(dir.path / "ckpt", dir.path / "model.safetensors");
  sw::consolidate_options hf;
  hf.rename = sw::transformers_llama_name;
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
