// Consolidation: a checkpoint saved sharded at TP 4 (padded vocabulary, repeated key-value heads) and at TP 2
// with sequence parallelism, written whole into one safetensors file whose tensors equal the unsharded model's;
// Hugging Face names; the folder given either way; bad checkpoints: damaged or mixed rank files, an output inside
// the checkpoint; the configuration and checksums the file carries, checked on load and by verify.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/file_checks.hpp>
#include <shardwise/checkpoint/pretrained.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <tuple>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

models::LlamaConfig config() {
  models::LlamaConfig c;
  c.vocabulary = 62, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
  return c;
}

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(std::string const& name)
      : path(fs::temp_directory_path() / ("shardwise_test_consolidate_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

/// The unsharded model's parameters (built on one rank, nothing padded or repeated), in traversal order.
std::vector<std::vector<float>> unsharded_parameters(models::LlamaConfig const& c) {
  std::vector<std::vector<float>> all;
  models::Llama<float> model(c);
  sw::detail::for_each_parameter(model, [&](auto const& p) {
    if (p.value->size() == 0) return;
    all.emplace_back(p.value->data(), p.value->data() + p.value->size());  // row-major, like safetensors
  });
  return all;
}

template <class Plan>
void save_at(int ranks, models::LlamaConfig const& c, fs::path const& dir) {
  sw::run_threads(ranks, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
    models::Llama<float, Plan> model(c);
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, dir, 3, {{"run", "consolidate test"}});
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
    for (auto const& w : words)
      CHECK_MESSAGE(message.find(w) != std::string::npos, "missing \"" << w << "\" in: " << message);
  }
  CHECK_MESSAGE(thrown, "no shardwise::error was thrown");
}

}  // namespace

TEST_CASE("consolidated tensors equal the unsharded model's, from TP 4 and from TP 2 with sequence parallelism") {
  auto const c = config();
  auto const expected = unsharded_parameters(c);
  scratch_dir dir("equal");
  save_at<models::llama_plan<false>>(4, c, dir.path / "tp4");
  save_at<models::llama_plan<true>>(2, c, dir.path / "sp2");
  for (fs::path const from : {dir.path / "tp4", dir.path / "sp2/tensor_parallel_shards"}) {
    INFO("from " << from.string());
    std::vector<std::string> progress;
    sw::consolidate_options options;
    options.progress = [&](std::size_t i, std::size_t n, std::string const& name, std::uint64_t) {
      progress.push_back(std::to_string(i) + "/" + std::to_string(n) + " " + name);
    };
    fs::path const out = dir.path / "model.safetensors";
    auto const index = sw::consolidate(from, out, options);
    sw::safetensors_file file(out.string());
    REQUIRE(file.tensors().size() == expected.size());
    REQUIRE(index.tensors.size() == expected.size());
    for (std::size_t i = 0; i < expected.size(); ++i) {
      INFO(index.tensors[i].name);
      CHECK(file.read<float>(index.tensors[i].name) == expected[i]);
    }
    CHECK(file.info("tok_embeddings.weight").shape == std::vector<std::uint64_t>{62, 32});
    CHECK(file.info("layers.1.attention.wv.weight").shape == std::vector<std::uint64_t>{16, 32});
    CHECK(file.metadata().at("run") == "consolidate test");
    CHECK(file.metadata().at("format") == "pt");
    CHECK(file.metadata().at("shardwise.step") == "3");
    REQUIRE(progress.size() == expected.size());
    CHECK(progress.front() == "0/21 layers.0.attention.wk.weight");  // written sorted by name ('.' before '_')
    CHECK(progress.back() == "20/21 tok_embeddings.weight");
  }
}

TEST_CASE("Hugging Face transformers' names for the Llama model") {
  CHECK(sw::transformers_llama_name("tok_embeddings.weight") == "model.embed_tokens.weight");
  CHECK(sw::transformers_llama_name("layers.10.attention.wk.weight") == "model.layers.10.self_attn.k_proj.weight");
  CHECK(sw::transformers_llama_name("layers.0.feed_forward.w1.weight") == "model.layers.0.mlp.gate_proj.weight");
  CHECK(sw::transformers_llama_name("layers.0.feed_forward.w3.weight") == "model.layers.0.mlp.up_proj.weight");
  CHECK(sw::transformers_llama_name("layers.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight");
  CHECK(sw::transformers_llama_name("output.weight") == "lm_head.weight");
  check_error([] { (void)sw::transformers_llama_name("layers.x.attention.wq.weight"); },
              {"\"layers.x.attention.wq.weight\"", "--names shardwise"});
  check_error([] { (void)sw::transformers_llama_name("output.bias"); }, {"\"output.bias\""});

  auto const c = config();
  scratch_dir dir("names");
  save_at<models::llama_plan<false>>(2, c, dir.path / "ckpt");
  sw::consolidate_options options;
  options.mapping = sw::transformers_llama_mapping();
  sw::consolidate(dir.path / "ckpt", dir.path / "hf.safetensors", options);
  sw::safetensors_file file((dir.path / "hf.safetensors").string());
  CHECK(file.contains("model.layers.1.self_attn.o_proj.weight"));
  CHECK(file.contains("lm_head.weight"));
  CHECK(!file.contains("output.weight"));
}

TEST_CASE("transformers' bias names; a bias the model lacks is refused even by a load that is not strict") {
  CHECK(sw::transformers_llama_name("layers.0.attention.wq.bias") == "model.layers.0.self_attn.q_proj.bias");
  CHECK(sw::transformers_llama_name("layers.3.feed_forward.w2.bias") == "model.layers.3.mlp.down_proj.bias");
  check_error([] { (void)sw::transformers_llama_name("layers.0.attention.wq.scale"); }, {"attention.wq.scale"});
  auto biased = config();
  biased.attention_bias = true;  // Qwen2's: q, k and v
  scratch_dir dir("biases");
  save_at<models::llama_plan<false>>(2, biased, dir.path / "ckpt");
  sw::consolidate_options options;
  options.mapping = sw::transformers_llama_mapping();
  sw::consolidate(dir.path / "ckpt", dir.path / "model.safetensors", options);
  CHECK(
      sw::safetensors_file((dir.path / "model.safetensors").string()).contains("model.layers.1.self_attn.v_proj.bias"));
  for (int ranks : {1, 2})
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      models::Llama<float, models::llama_plan<false>> plain(config());  // no biases
      sw::parallelize(plain, tp);
      check_error(
          [&] { (void)sw::load_pretrained(plain, tp, dir.path, sw::transformers_llama_mapping(), {.strict = false}); },
          {"the checkpoint's tensor \"model.layers.0.self_attn.k_proj.bias\" is the bias of a layer whose "
           "weight the model reads",
           "attention_bias or mlp_bias"});
      models::Llama<float, models::llama_plan<false>> with_biases(biased);  // loads, strict
      sw::parallelize(with_biases, tp);
      CHECK_NOTHROW((void)sw::load_pretrained(with_biases, tp, dir.path, sw::transformers_llama_mapping()));
    });
}

TEST_CASE(
    "Qwen3's q_norm and k_norm under transformers' names; a norm the model lacks is refused even when not strict") {
  CHECK(sw::transformers_llama_name("layers.1.attention.q_norm.weight") == "model.layers.1.self_attn.q_norm.weight");
  CHECK(sw::transformers_llama_name("layers.0.attention.k_norm.weight") == "model.layers.0.self_attn.k_norm.weight");
  auto normed = config();
  normed.qk_norm = true, normed.explicit_head_dim = 16;  // heads of 16 on a width of 32, as Qwen3's
  scratch_dir dir("head_norms");
  save_at<models::llama_plan<false>>(2, normed, dir.path / "ckpt");
  sw::consolidate_options options;
  options.mapping = sw::transformers_llama_mapping();
  sw::consolidate(dir.path / "ckpt", dir.path / "model.safetensors", options);
  CHECK(sw::safetensors_file((dir.path / "model.safetensors").string())
            .contains("model.layers.1.self_attn.k_norm.weight"));
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
    auto plain_config = normed;
    plain_config.qk_norm = false;  // the same shapes, no norms
    models::Llama<float, models::llama_plan<false>> plain(plain_config);
    sw::parallelize(plain, tp);
    check_error(
        [&] { (void)sw::load_pretrained(plain, tp, dir.path, sw::transformers_llama_mapping(), {.strict = false}); },
        {"the checkpoint's tensor \"model.layers.0.self_attn.k_norm.weight\" is a norm inside a module whose other "
         "tensors the model reads",
         "qk_norm"});
    models::Llama<float, models::llama_plan<false>> with_norms(normed);  // loads, strict
    sw::parallelize(with_norms, tp);
    CHECK_NOTHROW((void)sw::load_pretrained(with_norms, tp, dir.path, sw::transformers_llama_mapping()));
  });
}

namespace {
/// A mapping as GPT-2's: each layer's wq, wk and wv fused along their outputs into "layers.L.qkv", stored
/// transposed ([in, out]); wk and wv start at `k_at` and `v_at` (32 and 48 tile it); every other tensor as it is.
sw::checkpoint_mapping fused_qkv(std::uint64_t k_at = 32, std::uint64_t v_at = 48) {
  return [=](std::string const& name) -> std::optional<sw::tensor_source> {
    for (auto const& [leaf, start, size] : {std::tuple{".attention.wq.weight", std::uint64_t{0}, std::uint64_t{32}},
                                            std::tuple{".attention.wk.weight", k_at, std::uint64_t{16}},
                                            std::tuple{".attention.wv.weight", v_at, std::uint64_t{16}}})
      if (name.ends_with(leaf))
        return sw::tensor_source{name.substr(0, name.find(".attention")) + ".qkv", true, 0, start, size, 64};
    return sw::tensor_source{name};
  };
}
}  // namespace

TEST_CASE("consolidate under a mapping that fuses and transposes: each tensor in its place, and loaded back") {
  auto const c = config();
  auto const parameters = unsharded_parameters(c);
  scratch_dir dir("fused");
  save_at<models::llama_plan<false>>(4, c, dir.path / "ckpt");
  auto const index = sw::read_checkpoint_index(dir.path / "ckpt");
  std::map<std::string, std::vector<float>> expected;  // name -> the unsharded tensor, row-major [out, in]
  for (std::size_t i = 0; i < parameters.size(); ++i) expected[index.tensors[i].name] = parameters[i];
  sw::consolidate_options options;
  options.mapping = fused_qkv();
  fs::path const out = dir.path / "fused.safetensors";
  sw::consolidate(dir.path / "ckpt", out, options);
  sw::safetensors_file file(out.string());
  CHECK(file.tensors().size() == expected.size() - 4);  // 3 tensors per layer became 1
  CHECK(!file.contains("layers.0.attention.wq.weight"));
  REQUIRE(file.info("layers.1.qkv").shape == std::vector<std::uint64_t>{32, 64});  // [in, q + k + v outputs]
  auto const fused = file.read<float>("layers.1.qkv");
  auto const& wq = expected["layers.1.attention.wq.weight"];  // [32, 32]
  auto const& wv = expected["layers.1.attention.wv.weight"];  // [16, 32]
  for (std::size_t out_row = 0; out_row < 32; ++out_row)
    for (std::size_t in = 0; in < 32; ++in) {
      REQUIRE(fused[in * 64 + out_row] == wq[out_row * 32 + in]);
      if (out_row < 16) REQUIRE(fused[in * 64 + 48 + out_row] == wv[out_row * 32 + in]);
    }
  CHECK(file.read<float>("norm.weight") == expected["norm.weight"]);

  auto other = config();
  other.seed = 999;
  sw::run_threads(1, [&](auto& world) {  // the same mapping loads it back (saved at tp 4, loaded at 1)
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {1}));
    models::Llama<float, models::llama_plan<false>> model(other);
    sw::parallelize(model, tp);
    (void)sw::load_pretrained(model, tp, out, fused_qkv());
    std::vector<std::int64_t> ids(8);
    for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<std::int64_t>((i * 5 + 1) % 62);
    models::Llama<float> reference(c);
    auto const want = reference.forward(ids).local;
    auto const got = model.forward(ids).local;
    REQUIRE(got.rows() == want.rows());
    CHECK((got - want).cwiseAbs().maxCoeff() <= 1e-6f * want.cwiseAbs().maxCoeff());
  });
}

namespace {
/// A mapping as transformers 5's fused experts: each layer's wk and wv side by side (as gate_up_proj's gate and up)
/// at index `index(layer)` of one tensor "kv" [layers, 32, 32] stacked along its first dimension; every other tensor
/// as it is.
sw::checkpoint_mapping stacked_kv(std::function<std::int64_t(std::int64_t)> index = [](std::int64_t l) { return l; }) {
  return [=](std::string const& name) -> std::optional<sw::tensor_source> {
    bool const k = name.ends_with(".attention.wk.weight"), v = name.ends_with(".attention.wv.weight");
    if (!k && !v) return sw::tensor_source{name};
    std::int64_t const layer = std::stoll(name.substr(7, name.find('.', 7) - 7));  // "layers.L."
    return sw::tensor_source{.name = "kv",
                             .slice_dim = 0,
                             .slice_start = k ? 0u : 16u,
                             .slice_size = 16,
                             .slice_of = 32,
                             .stacked_index = index(layer)};
  };
}
}  // namespace

TEST_CASE("consolidate stacks tensors into one (fused experts): each in its index and slice, and loaded back") {
  auto const c = config();
  scratch_dir dir("stacked");
  save_at<models::llama_plan<false>>(2, c, dir.path / "ckpt");
  auto const parameters = unsharded_parameters(c);
  auto const index = sw::read_checkpoint_index(dir.path / "ckpt");
  std::map<std::string, std::vector<float>> expected;
  for (std::size_t i = 0; i < parameters.size(); ++i) expected[index.tensors[i].name] = parameters[i];
  fs::path const out = dir.path / "stacked.safetensors";
  sw::consolidate(dir.path / "ckpt", out, {.mapping = stacked_kv()});
  sw::safetensors_file file(out.string());
  REQUIRE(file.info("kv").shape == std::vector<std::uint64_t>{2, 32, 32});  // [layers, k's rows then v's, in]
  CHECK(!file.contains("layers.0.attention.wk.weight"));
  auto const kv = file.read<float>("kv");
  auto const& wk1 = expected["layers.1.attention.wk.weight"];  // [16, 32]
  auto const& wv0 = expected["layers.0.attention.wv.weight"];
  for (std::size_t row = 0; row < 16; ++row)
    for (std::size_t in = 0; in < 32; ++in) {
      REQUIRE(kv[(1 * 32 + row) * 32 + in] == wk1[row * 32 + in]);
      REQUIRE(kv[(0 * 32 + 16 + row) * 32 + in] == wv0[row * 32 + in]);
    }
  auto other = config();
  other.seed = 999;
  sw::run_threads(1, [&](auto& world) {  // the same mapping reads it back
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {1}));
    models::Llama<float> model(other);
    (void)sw::load_pretrained(model, tp, out, stacked_kv());
    CHECK(model.layers[1].attention.wk.weight == models::Llama<float>(c).layers[1].attention.wk.weight);
  });
  check_error(
      [&] {
        sw::consolidate(dir.path / "ckpt", dir.path / "gap.safetensors",
                        {.mapping = stacked_kv([](std::int64_t l) { return 2 * l; })});
      },
      {"the tensors stacked in \"kv\" do not fill it: index 2 after 1 indices"});
  auto const stacked = stacked_kv();
  check_error(
      [&] {
        sw::consolidate(dir.path / "ckpt", dir.path / "whole.safetensors",
                        {.mapping = [&](std::string const& n) -> std::optional<sw::tensor_source> {
                          if (n == "layers.0.attention.wq.weight") return sw::tensor_source{"kv"};
                          return stacked(n);
                        }});
      },
      {"tensor \"layers.0.attention.wq.weight\" maps to \"kv\", whose other tensors are stacked", "as a whole"});
}

TEST_CASE("consolidate refuses a mapping that drops a tensor, leaves a gap, or maps two tensors to one") {
  scratch_dir dir("bad_mapping");
  save_at<models::llama_plan<false>>(2, config(), dir.path / "ckpt");
  auto const attempt = [&](sw::checkpoint_mapping mapping) {
    sw::consolidate_options options;
    options.mapping = std::move(mapping);
    sw::consolidate(dir.path / "ckpt", dir.path / "out.safetensors", options);
  };
  check_error(
      [&] {
        attempt([](std::string const& n) -> std::optional<sw::tensor_source> {
          if (n == "norm.weight") return std::nullopt;
          return sw::tensor_source{n};
        });
      },
      {"tensor \"norm.weight\"", "no name in the output"});
  check_error(
      [&] { attempt(fused_qkv(32, 56)); },  // v starts 8 rows after k ends
      {"the slices mapped to \"layers.0.qkv\" do not tile it", "tensor \"layers.0.attention.wv.weight\"", "[56, 72)"});
  check_error([&] { attempt(fused_qkv(32, 40)); }, {"do not tile"});  // v overlaps k
  auto const fused = fused_qkv();
  check_error(
      [&] {
        attempt([&](std::string const& n) -> std::optional<sw::tensor_source> {
          if (n.ends_with(".wv.weight")) return sw::tensor_source{n};  // v left out of qkv
          return fused(n);
        });
      },
      {"the slices mapped to \"layers.0.qkv\" cover [0, 48) of its 64 along dimension 0"});
  check_error(
      [&] {
        attempt([&](std::string const& n) -> std::optional<sw::tensor_source> {
          if (n.ends_with(".wv.weight")) return sw::tensor_source{n.substr(0, n.find(".attention")) + ".qkv"};
          return fused(n);
        });
      },  // a slice and a whole tensor on one name (the whole one sorted first)
      {"tensor \"layers.0.attention.wv.weight\" maps to the whole of \"layers.0.qkv\""});
  check_error(
      [&] {
        attempt([](std::string const& n) -> std::optional<sw::tensor_source> {
          return sw::tensor_source{n.ends_with("_norm.weight") ? std::string("norms") : n};
        });
      },
      {"maps to the whole of \"norms\", which tensor", "maps to as well"});
  CHECK(!fs::exists(dir.path / "out.safetensors"));
}

TEST_CASE("consolidating a bad checkpoint: an error naming the file and the tensor") {
  auto const c = config();
  scratch_dir dir("bad");
  check_error([&] { sw::consolidate(dir.path, dir.path / "m.safetensors"); },
              {"shardwise::consolidate", dir.path.string(), "holds no shardwise_checkpoint.json"});
  save_at<models::llama_plan<false>>(2, c, dir.path / "ckpt");
  fs::remove_all(dir.path / "ckpt/tensor_parallel_shards/tp_rank_00_pp_rank_00");
  check_error([&] { sw::consolidate(dir.path / "ckpt", dir.path / "m.safetensors"); },
              {"tp_rank_00_pp_rank_00/model.safetensors", "is missing", "tensor \"tok_embeddings.weight\""});
  CHECK(!fs::exists(dir.path / "m.safetensors"));
}

namespace {

/// Flips the byte at `offset` of the file (a second flip restores it).
void flip_byte(fs::path const& file, std::uint64_t offset) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(static_cast<std::streamoff>(offset));
  char const c = static_cast<char>(f.get());
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(c ^ 0x10));
}

/// The offset in the file of the middle byte of tensor `name`'s data.
std::uint64_t middle_of(fs::path const& file, std::string const& name) {
  std::uint64_t header = 0;
  std::ifstream(file, std::ios::binary).read(reinterpret_cast<char*>(&header), 8);
  sw::tensor_info const info = sw::safetensors_file(file.string()).info(name);
  return 8 + header + (info.begin + info.end) / 2;
}

/// Loads `file` into a Llama model of config c at tp 2.
void load_at_tp2(models::LlamaConfig const& c, fs::path const& file) {
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
    models::Llama<float, models::llama_plan<false>> model(c);
    sw::parallelize(model, tp);
    (void)sw::load_consolidated(model, tp, file);
  });
}

}  // namespace

TEST_CASE("consolidate refuses a damaged rank file, naming the tensor, and writes nothing") {
  auto const c = config();
  scratch_dir dir("damaged");
  save_at<models::llama_plan<false>>(2, c, dir.path / "ckpt");
  fs::path const out = dir.path / "out/model.safetensors";
  // One byte flipped in each tensor of each rank file in turn (then flipped back): every one is caught.
  std::size_t flips = 0;
  for (int rank = 0; rank < 2; ++rank) {
    fs::path const file = dir.path / "ckpt" / sw::rank_folder(rank, 0) / "model.safetensors";
    std::vector<std::string> names;
    {
      sw::safetensors_file const rank_file(file.string());
      for (auto const& t : rank_file.tensors()) names.push_back(t.name);
    }
    for (auto const& name : names) {
      INFO("rank " << rank << ", tensor " << name);
      std::uint64_t const at = middle_of(file, name);
      flip_byte(file, at);
      check_error([&] { sw::consolidate(dir.path / "ckpt", out); },
                  {"shardwise::consolidate", file.string(), "tensor \"" + name + "\"",
                   "does not match the checksum its save recorded", "nothing was written"});
      CHECK(!fs::exists(out));
      flip_byte(file, at);
      ++flips;
    }
  }
  CHECK(flips >= 20);
  sw::consolidate(dir.path / "ckpt", out);  // restored: consolidates
  CHECK(sw::verify_safetensors_file(out.string()).empty());

  // A rank file of another save in its place: refused by generation.
  save_at<models::llama_plan<false>>(2, c, dir.path / "other");
  fs::path const moved = sw::rank_folder(1, 0) + "/model.safetensors";
  fs::copy_file(dir.path / "other" / moved, dir.path / "ckpt" / moved, fs::copy_options::overwrite_existing);
  check_error([&] { sw::consolidate(dir.path / "ckpt", dir.path / "mixed.safetensors"); },
              {"shardwise::consolidate", moved, "belongs to another save than the index"});
  CHECK(!fs::exists(dir.path / "mixed.safetensors"));
}

TEST_CASE("consolidate refuses an output inside the checkpoint (the next save there would delete it)") {
  auto const c = config();
  scratch_dir dir("inside");
  save_at<models::llama_plan<false>>(2, c, dir.path / "ckpt");
  for (fs::path const out :
       {dir.path / "ckpt/model.safetensors", dir.path / "ckpt/sub/model.safetensors",
        dir.path / "ckpt/tensor_parallel_shards/model.safetensors", dir.path / "ckpt/../ckpt/./model.safetensors"}) {
    INFO(out.string());
    check_error([&] { sw::consolidate(dir.path / "ckpt", out); },
                {"shardwise::consolidate", "is inside the checkpoint", "write it elsewhere"});
    CHECK(!fs::exists(out));
  }
  CHECK(!fs::exists(dir.path / "ckpt/sub"));
  sw::consolidate(dir.path / "ckpt", dir.path / "ckpt_consolidated/model.safetensors");  // beside it: fine
  CHECK(fs::exists(dir.path / "ckpt_consolidated/model.safetensors"));
}

TEST_CASE("a consolidated file carries the configuration and checksums; loads check them") {
  auto const c = config();
  scratch_dir dir("carries");
  save_at<models::llama_plan<false>>(4, c, dir.path / "ckpt");
  fs::path const file = dir.path / "model.safetensors";
  sw::consolidate(dir.path / "ckpt", file);
  {
    sw::safetensors_file const f(file.string());
    auto const config_text = f.metadata().at(sw::config_metadata_key);
    CHECK(nlohmann::json::parse(config_text).get<std::map<std::string, std::string>>() == c.fields());
    auto const sums = nlohmann::json::parse(f.metadata().at(sw::checksums_metadata_key));
    REQUIRE(sums.size() == f.tensors().size());
    for (auto const& t : f.tensors())  // each the checksum of the tensor's bytes, computed here anew
      CHECK(sums.at(t.name).get<std::string>() == sw::detail::hex64(sw::checksum64(f.raw(t.name))));
  }
  load_at_tp2(c, file);  // the same configuration: loads

  // Another configuration with the same shapes (2 heads of 16 instead of 4 of 8; another RoPE theta): refused,
  // naming the field.
  auto other_heads = c;
  other_heads.heads = 2, other_heads.kv_heads = 1;
  check_error([&] { load_at_tp2(other_heads, file); },
              {"shardwise::load_consolidated", "saved from a model with heads = 4 but this model has heads = 2"});
  auto other_theta = c;
  other_theta.rope_theta = 500000;
  check_error([&] { load_at_tp2(other_theta, file); }, {"rope_theta = 10000 but this model has rope_theta = 500000"});

  // A flipped byte: verify names the tensor, and the load refuses it.
  std::uint64_t const at = middle_of(file, "layers.1.feed_forward.w2.weight");
  flip_byte(file, at);
  auto const problems = sw::verify_safetensors_file(file.string());
  REQUIRE(problems.size() == 1);
  CHECK(problems[0].find("tensor \"layers.1.feed_forward.w2.weight\" does not match the checksum") !=
        std::string::npos);
  check_error(
      [&] { load_at_tp2(c, file); },
      {"shardwise::load_consolidated", "tensor \"layers.1.feed_forward.w2.weight\"", "does not match the checksum"});
  flip_byte(file, at);
  CHECK(sw::verify_safetensors_file(file.string()).empty());
}
