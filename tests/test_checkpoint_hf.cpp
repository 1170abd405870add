// Checkpoints of full tensors written by other programs (Hugging Face's save_pretrained), loaded through a
// mapping that renames, transposes, splits a fused tensor and slices: every rank's shard at TP 1, 2 and 4
// against the full tensor sliced here; strict errors word for word; the non-strict report; a sharded folder
// with model.safetensors.index.json. The files are written with safetensors_writer, apart from the loader.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <shardwise/checkpoint/pretrained.hpp>
#include <shardwise/checkpoint/safetensors_write.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/models/gpt2_names.hpp>
#include <shardwise/nn/layers/embedding.hpp>
#include <shardwise/nn/layers/linear.hpp>
#include <shardwise/nn/layers/norm.hpp>
#include <shardwise/nn/tie.hpp>
#include <shardwise/shardwise.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace sw = shardwise;
namespace fs = std::filesystem;

namespace {

using matrix = sw::nn::matrix<float>;
using vector = sw::nn::vector<float>;

constexpr std::size_t vocab = 16, dim = 8, hidden = 12, positions = 8;

/// A GPT-2-like block in shardwise's layout (weights [out, in]): embeddings cut along the features (wte) and
/// along the positions (wpe), a replicated norm, attention q, k, v cut along their outputs and its output
/// projection along its inputs (its bias replicated), an MLP input cut along its outputs.
template <class Plan = sw::serial_plan>
struct Mini {
  sw::Embedding<float, sw::layer_at<Plan, "wte">> wte;
  sw::Embedding<float, sw::layer_at<Plan, "wpe">> wpe;
  sw::LayerNorm<float, sw::layer_at<Plan, "ln">> ln;
  sw::Linear<float, sw::layer_at<Plan, "wq">> wq;
  sw::Linear<float, sw::layer_at<Plan, "wk">> wk;
  sw::Linear<float, sw::layer_at<Plan, "wv">> wv;
  sw::Linear<float, sw::layer_at<Plan, "proj">> proj;
  sw::Linear<float, sw::layer_at<Plan, "fc">> fc;
  SHARDWISE_CHILDREN(wte, wpe, ln, wq, wk, wv, proj, fc)

  explicit Mini(sw::init seed = 0)  // an sw::init, so that sw::Lazy can declare it
      : wte(vocab, dim, seed + 1),
        wpe(positions, dim, seed + 2),
        ln(dim, 1e-5f, seed),
        wq(dim, dim, seed + 3),
        wk(dim, dim, seed + 4),
        wv(dim, dim, seed + 5),
        proj(dim, dim, seed + 6),
        fc(dim, hidden, seed + 7) {}
};
using mini_plan =
    sw::plan<sw::at<"wte", sw::ColwiseParallel<sw::Replicate, sw::Shard<-1>>>,
             sw::at<"wpe", sw::RowwiseParallel<sw::Replicate, sw::Replicate>>, sw::at<"wq", sw::ColwiseParallel<>>,
             sw::at<"wk", sw::ColwiseParallel<>>, sw::at<"wv", sw::ColwiseParallel<>>,
             sw::at<"proj", sw::RowwiseParallel<>>, sw::at<"fc", sw::ColwiseParallel<>>>;
using Model = Mini<mini_plan>;

/// The same with one more layer: what a checkpoint of Mini lacks, and what Mini does not read of its own.
template <class Plan = sw::serial_plan>
struct MiniPlus {
  sw::Embedding<float, sw::layer_at<Plan, "wte">> wte{vocab, dim, 1};
  sw::Embedding<float, sw::layer_at<Plan, "wpe">> wpe{positions, dim, 2};
  sw::LayerNorm<float, sw::layer_at<Plan, "ln">> ln{dim};
  sw::Linear<float, sw::layer_at<Plan, "wq">> wq{dim, dim, 3};
  sw::Linear<float, sw::layer_at<Plan, "wk">> wk{dim, dim, 4};
  sw::Linear<float, sw::layer_at<Plan, "wv">> wv{dim, dim, 5};
  sw::Linear<float, sw::layer_at<Plan, "proj">> proj{dim, dim, 6};
  sw::Linear<float, sw::layer_at<Plan, "fc">> fc{dim, hidden, 7};
  sw::Linear<float, sw::layer_at<Plan, "head">> head{dim, vocab, 8};
  SHARDWISE_CHILDREN(wte, wpe, ln, wq, wk, wv, proj, fc, head)
};
using PlusModel = MiniPlus<sw::plan<sw::at<"wte", sw::ColwiseParallel<sw::Replicate, sw::Shard<-1>>>,
                                    sw::at<"wpe", sw::RowwiseParallel<sw::Replicate, sw::Replicate>>,
                                    sw::at<"wq", sw::ColwiseParallel<>>, sw::at<"wk", sw::ColwiseParallel<>>,
                                    sw::at<"wv", sw::ColwiseParallel<>>, sw::at<"proj", sw::RowwiseParallel<>>,
                                    sw::at<"fc", sw::ColwiseParallel<>>, sw::at<"head", sw::ColwiseParallel<>>>>;

/// Each model tensor, whole, in shardwise's orientation, and how the plan cuts it (-1: replicated).
struct expected_tensor {
  matrix value;  // a vector as one column
  int shard_dim;
};
using tensors = std::map<std::string, expected_tensor>;

matrix values(std::size_t rows, std::size_t cols, int seed) {
  matrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(seed * 1000 + i) / 64.0f;
  return m;
}

tensors model_tensors() {
  tensors t;
  t["wte.weight"] = {values(vocab, dim, 1), 1};
  t["wpe.weight"] = {values(positions, dim, 2), 0};
  t["ln.weight"] = {values(dim, 1, 3), -1};
  t["ln.bias"] = {values(dim, 1, 4), -1};
  int seed = 5;
  for (std::string const l : {"wq", "wk", "wv"}) {
    t[l + ".weight"] = {values(dim, dim, seed++), 0};
    t[l + ".bias"] = {values(dim, 1, seed++), 0};
  }
  t["proj.weight"] = {values(dim, dim, 20), 1};
  t["proj.bias"] = {values(dim, 1, 21), -1};
  t["fc.weight"] = {values(hidden, dim, 22), 0};
  t["fc.bias"] = {values(hidden, 1, 23), 0};
  return t;
}

/// GPT-2's names and layouts: Conv1D weights [in, out]; q, k and v fused along the outputs in c_attn.
std::map<std::string, matrix> gpt2_file(tensors const& m) {
  std::map<std::string, matrix> f;
  f["transformer.wte.weight"] = m.at("wte.weight").value;
  f["transformer.wpe.weight"] = m.at("wpe.weight").value;
  f["transformer.h.0.ln_1.weight"] = m.at("ln.weight").value;
  f["transformer.h.0.ln_1.bias"] = m.at("ln.bias").value;
  matrix fused(3 * dim, dim), fused_bias(3 * dim, 1);
  fused << m.at("wq.weight").value, m.at("wk.weight").value, m.at("wv.weight").value;
  fused_bias << m.at("wq.bias").value, m.at("wk.bias").value, m.at("wv.bias").value;
  f["transformer.h.0.attn.c_attn.weight"] = fused.transpose();
  f["transformer.h.0.attn.c_attn.bias"] = fused_bias;
  f["transformer.h.0.attn.c_proj.weight"] = m.at("proj.weight").value.transpose();
  f["transformer.h.0.attn.c_proj.bias"] = m.at("proj.bias").value;
  f["transformer.h.0.mlp.c_fc.weight"] = m.at("fc.weight").value.transpose();
  f["transformer.h.0.mlp.c_fc.bias"] = m.at("fc.bias").value;
  return f;
}

/// A GPT-2 mapping, as a user writes one: names, Conv1D's transposed weights, q, k, v sliced out of c_attn.
std::optional<sw::tensor_source> gpt2_mapping(std::string const& name) {
  std::string const layer = name.substr(0, name.find('.')), leaf = name.substr(name.find('.') + 1);
  if (layer == "wte" || layer == "wpe") return sw::tensor_source{"transformer." + name};
  if (layer == "ln") return sw::tensor_source{"transformer.h.0.ln_1." + leaf};
  bool const weight = leaf == "weight";  // Conv1D: every weight is stored [in, out]
  if (layer == "proj") return sw::tensor_source{"transformer.h.0.attn.c_proj." + leaf, weight};
  if (layer == "fc") return sw::tensor_source{"transformer.h.0.mlp.c_fc." + leaf, weight};
  std::uint64_t const part = layer == "wq" ? 0 : layer == "wk" ? 1 : 2;  // q | k | v along c_attn's outputs
  return sw::tensor_source{"transformer.h.0.attn.c_attn." + leaf, weight, 0, part * dim, dim};
}

void write_file(fs::path const& path, std::map<std::string, matrix> const& f,
                std::map<std::string, std::string> const& metadata = {{"format", "pt"}}) {
  sw::safetensors_writer w;
  for (auto const& [name, m] : f) {
    std::vector<std::uint64_t> shape{static_cast<std::uint64_t>(m.rows()), static_cast<std::uint64_t>(m.cols())};
    if (m.cols() == 1) shape.pop_back();  // a vector (no model matrix here has one column)
    w.add(name, sw::dtype::F32, shape, std::as_bytes(std::span<float const>(m.data(), std::size_t(m.size()))));
  }
  w.write(path, metadata);
}

struct scratch_dir {
  fs::path path;
  explicit scratch_dir(std::string const& name)
      : path(fs::temp_directory_path() / ("shardwise_test_hf_" + std::to_string(::getpid()) + "_" + name)) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~scratch_dir() { fs::remove_all(path); }
};

/// This rank's block of a whole tensor, cut here (not by the code under test).
matrix slice(expected_tensor const& t, int rank, int ranks) {
  if (t.shard_dim == 0) {
    Eigen::Index const n = t.value.rows() / ranks;
    return t.value.middleRows(rank * n, n);
  }
  if (t.shard_dim == 1) {
    Eigen::Index const n = t.value.cols() / ranks;
    return t.value.middleCols(rank * n, n);
  }
  return t.value;
}

/// Every parameter of this rank's model by name, as a matrix (a vector as one column).
template <class M>
std::map<std::string, matrix> local_parameters(M& model) {
  std::map<std::string, matrix> out;
  auto add = [&](std::string const& name, auto const& v) { out[name] = v.template cast<float>(); };
  add("wte.weight", model.wte.weight);
  add("wpe.weight", model.wpe.weight);
  add("ln.weight", model.ln.weight);
  add("ln.bias", model.ln.bias);
  auto add_linear = [&](std::string const& name, auto const& l) {
    add(name + ".weight", l.weight);
    add(name + ".bias", l.bias);
  };
  add_linear("wq", model.wq);
  add_linear("wk", model.wk);
  add_linear("wv", model.wv);
  add("proj.weight", model.proj.weight);
  add("proj.bias", model.proj.bias);
  add("fc.weight", model.fc.weight);
  add("fc.bias", model.fc.bias);
  return out;
}

/// Checks every parameter of this rank against the expected tensors (those in `kept`: against `before`).
void check_shard(std::map<std::string, matrix> const& got, tensors const& expected, int rank, int ranks,
                 std::map<std::string, matrix> const& before = {}) {
  for (auto const& entry : expected) {
    auto const& name = entry.first;  // not a structured binding: doctest's INFO captures it in a lambda
    auto const& t = entry.second;
    INFO("tensor " << name << " on rank " << rank << " of " << ranks);
    matrix const want = before.count(name) ? before.at(name) : slice(t, rank, ranks);
    REQUIRE(got.at(name).rows() == want.rows());
    REQUIRE(got.at(name).cols() == want.cols());
    CHECK(got.at(name) == want);
  }
}

/// Runs `load(model, tp)` at TP `ranks` on a model built from other values; checks every rank's shard.
template <class Load>
void load_and_check(int ranks, tensors const& expected, Load&& load) {
  sw::run_threads(ranks, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
    Model model;
    sw::parallelize(model, tp);
    load(model, tp);
    check_shard(local_parameters(model), expected, tp.rank(), ranks);
  });
}

/// The message of the shardwise::error fn throws ("" when none).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (sw::error const& e) {
    return e.what();
  }
  return "";
}

/// Loads `path` into the model at TP 1 with `mapping` and `options`.
sw::load_report load_at_tp1(fs::path const& path, sw::checkpoint_mapping const& mapping,
                            sw::load_options const& options = {}) {
  sw::load_report report;
  sw::run_threads(1, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {1}));
    Model model;
    sw::parallelize(model, tp);
    report = sw::load_pretrained(model, tp, path, mapping, options);
  });
  return report;
}

}  // namespace

TEST_CASE("GPT-2's layout: renamed, Conv1D weights transposed, q, k and v split out of c_attn, at TP 1, 2 and 4") {
  auto const expected = model_tensors();
  scratch_dir dir("gpt2");
  write_file(dir.path / "model.safetensors", gpt2_file(expected));
  auto const staging = sw::detail::load_staging_bytes;
  for (int ranks : {1, 2, 4}) {
    INFO("TP " << ranks);
    load_and_check(ranks, expected, [&](Model& model, auto const& tp) {
      auto const report = sw::load_pretrained(model, tp, dir.path, gpt2_mapping);
      CHECK(report.missing.empty());
      CHECK(report.unexpected.empty());  // the fused c_attn counts as read
      CHECK(report.metadata.at("format") == "pt");
    });
    // Many small reads: transposed blocks staged 12 bytes at a time; rank 0 reading for everyone; in turns.
    sw::detail::load_staging_bytes = 12;
    for (sw::load_options const options :
         {sw::load_options{}, sw::load_options{.only_rank0_reads = true}, sw::load_options{.ranks_per_step = 1}}) {
      INFO("only_rank0_reads " << options.only_rank0_reads << ", ranks_per_step " << options.ranks_per_step);
      load_and_check(ranks, expected, [&](Model& model, auto const& tp) {
        (void)sw::load_pretrained(model, tp, dir.path / "model.safetensors", gpt2_mapping, options);
      });
    }
    sw::detail::load_staging_bytes = staging;
    // A lazily declared model: each rank allocates its shard only, filled through the same mapping.
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      sw::Lazy<Model> lazy(sw::init(0));
      sw::parallelize(lazy, tp);
      sw::load_report report;
      Model& model = sw::load_pretrained(lazy, tp, dir.path, gpt2_mapping, {}, &report);
      CHECK(report.metadata.at("format") == "pt");
      check_shard(local_parameters(model), expected, tp.rank(), ranks);
    });
  }
}

TEST_CASE("the GPT-2 mapping of docs/checkpoints.md gives GPT-2's names, transposes and slices") {
  std::uint64_t const dim = 768;
  auto gpt2 = [dim](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "lm_head.weight") return sw::tensor_source{"transformer.wte.weight"};  // tied: saved once
    std::string hf = "transformer." + name;  // h.0.ln_1.weight, wte.weight, ln_f.bias, ...
    bool const weight = name.ends_with(".weight");
    std::string_view const parts[] = {".attn.q_proj.", ".attn.k_proj.", ".attn.v_proj."};
    for (std::uint64_t i = 0; i < 3; ++i)  // q | k | v: rows [i dim, (i + 1) dim) of c_attnᵀ
      if (auto const at = hf.find(parts[i]); at != std::string::npos)
        return sw::tensor_source{hf.replace(at, parts[i].size(), ".attn.c_attn."), weight, 0, i * dim, dim};
    bool const conv1d = hf.find(".c_proj.") != std::string::npos || hf.find(".c_fc.") != std::string::npos;
    return sw::tensor_source{hf, conv1d && weight};  // Conv1D weights are stored [in, out]
  };
  auto const is = [&](std::string const& name, std::string const& file, bool transpose, int dim_, std::uint64_t start,
                      std::uint64_t size) {
    INFO(name);
    auto const s = gpt2(name);
    REQUIRE(s);
    CHECK(s->name == file);
    CHECK(s->transpose == transpose);
    CHECK(s->slice_dim == dim_);
    CHECK(s->slice_start == start);
    CHECK(s->slice_size == size);
  };
  is("h.0.attn.q_proj.weight", "transformer.h.0.attn.c_attn.weight", true, 0, 0, dim);
  is("h.11.attn.k_proj.bias", "transformer.h.11.attn.c_attn.bias", false, 0, dim, dim);
  is("h.2.attn.v_proj.weight", "transformer.h.2.attn.c_attn.weight", true, 0, 2 * dim, dim);
  is("h.2.attn.c_proj.weight", "transformer.h.2.attn.c_proj.weight", true, -1, 0, 0);
  is("h.2.attn.c_proj.bias", "transformer.h.2.attn.c_proj.bias", false, -1, 0, 0);
  is("h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.weight", true, -1, 0, 0);
  is("h.0.mlp.c_proj.weight", "transformer.h.0.mlp.c_proj.weight", true, -1, 0, 0);
  is("h.0.ln_2.weight", "transformer.h.0.ln_2.weight", false, -1, 0, 0);
  is("wte.weight", "transformer.wte.weight", false, -1, 0, 0);
  is("wpe.weight", "transformer.wpe.weight", false, -1, 0, 0);
  is("ln_f.bias", "transformer.ln_f.bias", false, -1, 0, 0);
  is("lm_head.weight", "transformer.wte.weight", false, -1, 0, 0);
}

TEST_CASE("slices along either dimension, of a transposed tensor too; renames only, with either function") {
  auto const expected = model_tensors();
  scratch_dir dir("slices");
  // wq and wk side by side in one [dim, 2 dim] tensor; proj stored transposed in the lower half of a
  // [2 dim, dim] tensor, so that its model orientation is the right half of [dim, 2 dim]; the rest as named.
  std::map<std::string, matrix> f;
  for (auto const& [name, t] : expected) f["model." + name] = t.value;
  matrix packed(dim, 2 * dim), lower(2 * dim, dim);
  packed << expected.at("wq.weight").value, expected.at("wk.weight").value;
  lower << values(dim, dim, 99), expected.at("proj.weight").value.transpose();
  f.erase("model.wq.weight"), f.erase("model.wk.weight"), f.erase("model.proj.weight");
  f["packed"] = packed;
  f["lower"] = lower;
  write_file(dir.path / "model.safetensors", f);
  auto const mapping = [](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "wq.weight") return sw::tensor_source{"packed", false, 1, 0, dim};
    if (name == "wk.weight") return sw::tensor_source{"packed", false, 1, dim, dim};
    if (name == "proj.weight") return sw::tensor_source{"lower", true, 1, dim, dim};
    return sw::tensor_source{"model." + name};
  };
  for (int ranks : {1, 2, 4}) {
    INFO("TP " << ranks);
    load_and_check(ranks, expected, [&](Model& model, auto const& tp) {
      auto const report = sw::load_pretrained(model, tp, dir.path / "model.safetensors", mapping);
      CHECK(report.unexpected.empty());
    });
  }

  // Renames only: the rename overload of load_consolidated and a mapping that gives names alone agree.
  std::map<std::string, matrix> renamed;
  for (auto const& [name, t] : expected) renamed["model." + name] = t.value;
  write_file(dir.path / "renamed.safetensors", renamed, {{"run", "7"}});
  auto const prefix = [](std::string const& name) { return "model." + name; };
  for (int ranks : {1, 2, 4}) {
    INFO("TP " << ranks);
    load_and_check(ranks, expected, [&](Model& model, auto const& tp) {
      CHECK(sw::load_consolidated(model, tp, dir.path / "renamed.safetensors", prefix).at("run") == "7");
    });
    load_and_check(ranks, expected, [&](Model& model, auto const& tp) {
      auto const by_name = [&](std::string const& name) -> std::optional<sw::tensor_source> {
        return sw::tensor_source{prefix(name)};
      };
      CHECK(sw::load_pretrained(model, tp, dir.path / "renamed.safetensors", by_name).metadata.at("run") == "7");
    });
  }
  // Without a mapping, the model's own names.
  std::map<std::string, matrix> own;
  for (auto const& [name, t] : expected) own[name] = t.value;
  write_file(dir.path / "own.safetensors", own);
  load_and_check(2, expected, [&](Model& model, auto const& tp) {
    (void)sw::load_pretrained(model, tp, dir.path / "own.safetensors");
  });
}

TEST_CASE("non-strict: missing and unexpected tensors reported, missing ones keep their values, at TP 1, 2, 4") {
  auto const expected = model_tensors();
  scratch_dir dir("report");
  auto f = gpt2_file(expected);
  f.erase("transformer.h.0.mlp.c_fc.bias");
  f["lm_head.weight"] = values(vocab, dim, 50);
  f["transformer.h.0.attn.masked_bias"] = values(1, 1, 51);
  write_file(dir.path / "model.safetensors", f);
  auto const mapping = [](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "wpe.weight") return std::nullopt;  // the mapping has no source for it
    return gpt2_mapping(name);
  };
  for (int ranks : {1, 2, 4})
    for (bool const rank0_reads : {false, true}) {  // every rank skips the missing ones alike
      INFO("TP " << ranks << ", only_rank0_reads " << rank0_reads);
      sw::run_threads(ranks, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
        Model model;
        sw::parallelize(model, tp);
        auto const before = local_parameters(model);
        auto const report =
            sw::load_pretrained(model, tp, dir.path, mapping, {.only_rank0_reads = rank0_reads, .strict = false});
        CHECK(report.missing == std::vector<std::string>{"wpe.weight", "fc.bias"});  // in the model's order
        CHECK(report.unexpected == std::vector<std::string>{"lm_head.weight", "transformer.h.0.attn.masked_bias",
                                                            "transformer.wpe.weight"});  // nothing reads it now
        check_shard(local_parameters(model), expected, tp.rank(), ranks,
                    {{"wpe.weight", before.at("wpe.weight")}, {"fc.bias", before.at("fc.bias")}});
      });
    }
  // A lazily declared model: the missing tensors stay zero.
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
    sw::Lazy<Model> lazy(sw::init(0));
    sw::parallelize(lazy, tp);
    sw::load_report report;
    Model& model = sw::load_pretrained(lazy, tp, dir.path, mapping, {.strict = false}, &report);
    CHECK(report.missing.size() == 2);
    CHECK(model.wpe.weight.isZero());
    CHECK(model.fc.bias.isZero());
    CHECK(model.fc.weight == slice(expected.at("fc.weight"), tp.rank(), 2));
  });
}

TEST_CASE("strict: missing, unexpected, misshapen and out-of-range sources are errors naming the tensor and the fix") {
  auto const expected = model_tensors();
  scratch_dir dir("strict");
  fs::path const file = dir.path / "model.safetensors";
  std::string const where = "shardwise::load_pretrained: \"" + file.string() + "\": ";
  auto f = gpt2_file(expected);
  f["lm_head.weight"] = values(vocab, dim, 50);
  write_file(file, f);
  CHECK(error_of([&] { load_at_tp1(file, gpt2_mapping); }) ==
        where +
            "the checkpoint's tensor \"lm_head.weight\" is not in the model (no model tensor reads it); load it into "
            "the model it was saved from, map a model tensor to it, or pass load_options{.strict = false} to skip it");
  f.erase("lm_head.weight");
  f.erase("transformer.h.0.mlp.c_fc.bias");
  write_file(file, f);
  CHECK(error_of([&] { load_at_tp1(file, gpt2_mapping); }) ==
        where +
            "the model's tensor \"fc.bias\" is not in the checkpoint (as \"transformer.h.0.mlp.c_fc.bias\"); load a "
            "checkpoint of this model, fix the mapping, or pass load_options{.strict = false} to keep its current "
            "value");
  auto const no_wpe = [](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "wpe.weight") return std::nullopt;
    return gpt2_mapping(name);
  };
  CHECK(error_of([&] { load_at_tp1(file, no_wpe); }) ==
        where +
            "the model's tensor \"wpe.weight\" is not in the checkpoint (the mapping gives it no source); load a "
            "checkpoint of this model, fix the mapping, or pass load_options{.strict = false} to keep its current "
            "value");
  f["transformer.h.0.mlp.c_fc.bias"] = expected.at("fc.bias").value;
  write_file(file, f);
  // c_fc's weight read without its transpose: [8, 12] in the file, [12, 8] in the model.
  auto const untransposed = [](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "fc.weight") return sw::tensor_source{"transformer.h.0.mlp.c_fc.weight"};
    return gpt2_mapping(name);
  };
  CHECK(error_of([&] { load_at_tp1(file, untransposed); }) ==
        where +
            "tensor \"fc.weight\" has shape [12, 8] in the model but [8, 12] in the checkpoint (file tensor "
            "\"transformer.h.0.mlp.c_fc.weight\" of shape [8, 12]); fix the mapping's transpose or slice, or load a "
            "checkpoint of the same model configuration");
  // A slice of the wrong size after transposing, and one beyond the tensor.
  auto const sliced = [](std::uint64_t start, std::uint64_t size) {
    return [=](std::string const& name) -> std::optional<sw::tensor_source> {
      if (name == "wv.weight") return sw::tensor_source{"transformer.h.0.attn.c_attn.weight", true, 0, start, size};
      return gpt2_mapping(name);
    };
  };
  CHECK(error_of([&] { load_at_tp1(file, sliced(8, 16)); }) ==
        where +
            "tensor \"wv.weight\" has shape [8, 8] in the model but [16, 8] in the checkpoint (file tensor "
            "\"transformer.h.0.attn.c_attn.weight\" of shape [8, 24], transposed, sliced to [8, 24) along dimension "
            "0); fix the mapping's transpose or slice, or load a checkpoint of the same model configuration");
  CHECK(error_of([&] { load_at_tp1(file, sliced(20, 8)); }) ==
        where +
            "the model's tensor \"wv.weight\" maps to file tensor \"transformer.h.0.attn.c_attn.weight\" of shape [8, "
            "24], transposed, sliced to [20, 28) along dimension 0, beyond its 24 along dimension 0; slice inside the "
            "tensor: fix the mapping");
  auto const bias_along_1 = [](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "wq.bias") return sw::tensor_source{"transformer.h.0.attn.c_attn.bias", false, 1, 0, dim};
    return gpt2_mapping(name);
  };
  CHECK(error_of([&] { load_at_tp1(file, bias_along_1); }) ==
        where +
            "the model's tensor \"wq.bias\" maps to file tensor \"transformer.h.0.attn.c_attn.bias\" of shape [24], "
            "sliced to [0, 8) along dimension 1, which has no dimension 1; slice along dimension 0 (or -1: whole): "
            "fix the mapping");
  // The same checks through the rename-only load_consolidated, in its own name.
  CHECK(
      error_of([&] {
        sw::run_threads(1, [&](auto& world) {
          auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {1}));
          Model model;
          sw::parallelize(model, tp);
          (void)sw::load_consolidated(model, tp, file);
        });
      })
          .rfind("shardwise::load_consolidated: \"" + file.string() +
                     "\": the model's tensor \"wte.weight\" is not in the checkpoint; load a checkpoint of this model",
                 0) == 0);
  // Not a checkpoint.
  CHECK(error_of([&] { load_at_tp1(dir.path / "empty", gpt2_mapping); }).find("cannot open") != std::string::npos);
  fs::create_directories(dir.path / "empty");
  CHECK(error_of([&] { load_at_tp1(dir.path / "empty", gpt2_mapping); }) ==
        "shardwise::load_pretrained: \"" + (dir.path / "empty").string() +
            "\" holds neither model.safetensors nor model.safetensors.index.json; give a safetensors file or a "
            "folder that save_pretrained wrote");
}

TEST_CASE("a sharded save_pretrained folder: model.safetensors.index.json maps each tensor to its file") {
  auto const expected = model_tensors();
  scratch_dir dir("sharded");
  auto const all = gpt2_file(expected);
  std::map<std::string, matrix> first, second;  // the fused c_attn in one file, the rest split between both
  for (auto const& [name, m] : all) (name.find(".h.0.attn") != std::string::npos ? first : second)[name] = m;
  second["transformer.h.0.mlp.c_fc.bias"] = all.at("transformer.h.0.mlp.c_fc.bias");
  first["transformer.wte.weight"] = all.at("transformer.wte.weight");
  second.erase("transformer.wte.weight");
  write_file(dir.path / "model-00001-of-00002.safetensors", first);
  write_file(dir.path / "model-00002-of-00002.safetensors", second);
  nlohmann::json index = {{"metadata", {{"total_size", 4096}}}, {"weight_map", nlohmann::json::object()}};
  for (auto const& [name, m] : first) index["weight_map"][name] = "model-00001-of-00002.safetensors";
  for (auto const& [name, m] : second) index["weight_map"][name] = "model-00002-of-00002.safetensors";
  std::ofstream(dir.path / "model.safetensors.index.json") << index.dump(2);
  for (int ranks : {1, 2, 4}) {
    INFO("TP " << ranks);
    load_and_check(ranks, expected, [&](Model& model, auto const& tp) {
      auto const report = sw::load_pretrained(model, tp, dir.path, gpt2_mapping);
      CHECK(report.metadata.at("total_size") == "4096");
      CHECK(report.metadata.at("format") == "pt");
      CHECK(report.unexpected.empty());
    });
  }
  // The index names a file that is gone, and a tensor a file does not hold.
  std::string const label = (dir.path / "model.safetensors.index.json").string();
  index["weight_map"]["transformer.h.0.ln_1.bias"] = "model-00003-of-00002.safetensors";
  std::ofstream(dir.path / "model.safetensors.index.json", std::ios::trunc) << index.dump(2);
  CHECK(error_of([&] { load_at_tp1(dir.path, gpt2_mapping); }) ==
        "shardwise::load_pretrained: \"" + label + "\" puts tensor \"transformer.h.0.ln_1.bias\" in \"" +
            (dir.path / "model-00003-of-00002.safetensors").string() +
            "\", which is missing; the folder is incomplete: copy the file back or save the model again");
  index["weight_map"]["transformer.h.0.ln_1.bias"] = "model-00001-of-00002.safetensors";
  std::ofstream(dir.path / "model.safetensors.index.json", std::ios::trunc) << index.dump(2);
  CHECK(error_of([&] { load_at_tp1(dir.path, gpt2_mapping); }) ==
        "shardwise::load_pretrained: \"" + label + "\" puts tensor \"transformer.h.0.ln_1.bias\" in \"" +
            (dir.path / "model-00001-of-00002.safetensors").string() +
            "\", which does not hold it; the folder is incomplete or mixed: save the model again");
  std::ofstream(dir.path / "model.safetensors.index.json", std::ios::trunc) << "{\"metadata\": {}}";
  CHECK(error_of([&] { load_at_tp1(dir.path, gpt2_mapping); }) ==
        "shardwise::load_pretrained: \"" + label +
            "\" has no \"weight_map\" object of tensor names to files; it is not a save_pretrained shard index: save "
            "the model again");
  // Nested deeper than any index, or a FIFO in its place: refused before parsing, and never waited on.
  std::ofstream(dir.path / "model.safetensors.index.json", std::ios::trunc)
      << "{\"weight_map\": {\"a\": " << std::string(100000, '[') << std::string(100000, ']') << "}}";
  CHECK(error_of([&] { load_at_tp1(dir.path, gpt2_mapping); }) ==
        "shardwise::load_pretrained: \"" + label +
            "\" nests JSON 65 deep; it is not a save_pretrained shard index: save the model again");
  fs::remove(dir.path / "model.safetensors.index.json");
  REQUIRE(::mkfifo(label.c_str(), 0600) == 0);
  CHECK(error_of([&] { load_at_tp1(dir.path, gpt2_mapping); }).find("\"" + label + "\" is not a regular file") !=
        std::string::npos);
}

TEST_CASE("load_sharded takes strict = false too: a checkpoint with a tensor more or less than the model") {
  auto const expected = model_tensors();
  scratch_dir dir("sharded_non_strict");
  std::map<std::string, matrix> own;
  for (auto const& [name, t] : expected) own[name] = t.value;
  write_file(dir.path / "own.safetensors", own);
  sw::run_threads(2, [&](auto& world) {  // Mini's values saved sharded at TP 2, and MiniPlus's at TP 2
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
    Model model;
    sw::parallelize(model, tp);
    (void)sw::load_pretrained(model, tp, dir.path / "own.safetensors");
    sw::save_sharded(model, tp, dir.path / "mini", 1);
    PlusModel plus;
    sw::parallelize(plus, tp);
    (void)sw::load_pretrained(plus, tp, dir.path / "own.safetensors", {}, {.strict = false});
    sw::save_sharded(plus, tp, dir.path / "plus", 1);
  });
  for (int ranks : {1, 4}) {
    INFO("TP " << ranks);
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      PlusModel plus;
      sw::parallelize(plus, tp);
      matrix const head = plus.head.weight;
      (void)sw::load_sharded(plus, tp, dir.path / "mini", {.strict = false});
      check_shard(local_parameters(plus), expected, tp.rank(), ranks);
      CHECK(plus.head.weight == head);  // missing: kept
      Model model;
      sw::parallelize(model, tp);
      (void)sw::load_sharded(model, tp, dir.path / "plus", {.strict = false});  // head.*: not read
      check_shard(local_parameters(model), expected, tp.rank(), ranks);
    });
  }
  auto const strict_error = [&](fs::path const& ckpt, bool plus) {
    return error_of([&] {
      sw::run_threads(1, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {1}));
        if (plus) {
          PlusModel m;
          sw::parallelize(m, tp);
          (void)sw::load_sharded(m, tp, ckpt);
        } else {
          Model m;
          sw::parallelize(m, tp);
          (void)sw::load_sharded(m, tp, ckpt);
        }
      });
    });
  };
  std::string const index = "shardwise::load_sharded: \"" + (dir.path / "plus/shardwise_checkpoint.json").string();
  CHECK(strict_error(dir.path / "plus", false) ==
        index +
            "\": the checkpoint's tensor \"head.weight\" is not in the model; load the checkpoint into the model it "
            "was saved from, or pass load_options{.strict = false} to skip it");
  CHECK(strict_error(dir.path / "mini", true) ==
        "shardwise::load_sharded: \"" + (dir.path / "mini/shardwise_checkpoint.json").string() +
            "\": the model's tensor \"head.weight\" is not in the checkpoint; load a checkpoint saved from this "
            "model, or pass load_options{.strict = false} to keep its current value");
}

TEST_CASE("transformers_gpt2_mapping: GPT2LMHeadModel's names, Conv1D weights transposed, q, k, v sliced from c_attn") {
  std::uint64_t const dim = 768;
  auto const gpt2 = sw::transformers_gpt2_mapping(dim);
  auto const is = [&](std::string const& name, std::string const& file, bool transpose, int slice_dim,
                      std::uint64_t start, std::uint64_t size) {
    INFO(name);
    auto const s = gpt2(name);
    REQUIRE(s);
    CHECK(s->name == file);
    CHECK(s->transpose == transpose);
    CHECK(s->slice_dim == slice_dim);
    CHECK(s->slice_start == start);
    CHECK(s->slice_size == size);
  };
  is("h.0.attn.q_proj.weight", "transformer.h.0.attn.c_attn.weight", true, 0, 0, dim);
  is("h.0.attn.q_proj.bias", "transformer.h.0.attn.c_attn.bias", false, 0, 0, dim);
  is("h.11.attn.k_proj.bias", "transformer.h.11.attn.c_attn.bias", false, 0, dim, dim);
  is("h.2.attn.v_proj.weight", "transformer.h.2.attn.c_attn.weight", true, 0, 2 * dim, dim);
  is("h.2.attn.c_proj.weight", "transformer.h.2.attn.c_proj.weight", true, -1, 0, 0);
  is("h.2.attn.c_proj.bias", "transformer.h.2.attn.c_proj.bias", false, -1, 0, 0);
  is("h.0.mlp.c_fc.weight", "transformer.h.0.mlp.c_fc.weight", true, -1, 0, 0);
  is("h.0.mlp.c_fc.bias", "transformer.h.0.mlp.c_fc.bias", false, -1, 0, 0);
  is("h.10.mlp.c_proj.weight", "transformer.h.10.mlp.c_proj.weight", true, -1, 0, 0);
  is("h.0.ln_1.bias", "transformer.h.0.ln_1.bias", false, -1, 0, 0);
  is("h.0.ln_2.weight", "transformer.h.0.ln_2.weight", false, -1, 0, 0);
  is("wte.weight", "transformer.wte.weight", false, -1, 0, 0);
  is("wpe.weight", "transformer.wpe.weight", false, -1, 0, 0);
  is("ln_f.weight", "transformer.ln_f.weight", false, -1, 0, 0);
  is("ln_f.bias", "transformer.ln_f.bias", false, -1, 0, 0);
  is("lm_head.weight", "lm_head.weight", false, -1, 0, 0);  // tied to wte: a tied model never asks
  for (std::string const wrong : {"h.x.ln_1.weight", "h.0.attn.c_attn.weight", "h.0.ln_1.scale", "h..ln_1.weight",
                                  "transformer.wte.weight", "lm_head.bias", "h.0.attn.q_proj"})
    CHECK_THROWS_WITH_AS((void)gpt2(wrong),
                         ("shardwise::transformers_gpt2_source: tensor \"" + wrong +
                          "\" is not a parameter of shardwise's GPT-2 (models::GPT2); map it with a mapping of your "
                          "own")
                             .c_str(),
                         sw::error);
}

namespace {
/// An LM head tied to the token embedding (as GPT-2's): the table cut along the vocabulary on both.
template <class Plan = sw::serial_plan>
struct TiedMini {
  sw::Embedding<float, sw::layer_at<Plan, "wte">> wte{vocab, dim, 1};
  sw::LayerNorm<float, sw::layer_at<Plan, "ln_f">> ln_f{dim};
  sw::Linear<float, sw::layer_at<Plan, "lm_head">> lm_head{dim, vocab, 2, false};
  SHARDWISE_CHILDREN(wte, ln_f, lm_head)
  TiedMini() { sw::tie_weights(lm_head, wte); }
};
using TiedModel = TiedMini<sw::plan<sw::at<"wte", sw::RowwiseParallel<sw::Replicate, sw::Replicate>>,
                                    sw::at<"lm_head", sw::ColwiseParallel<sw::Replicate, sw::Shard<-1>>>>>;
}  // namespace

TEST_CASE(
    "a tied weight: loaded once as its owner; a file's copy (lm_head.weight) is unexpected, or when strict "
    "an error saying the model ties it") {
  scratch_dir dir("tied");
  matrix const table = values(vocab, dim, 1), head = values(vocab, dim, 9);
  std::map<std::string, matrix> f{{"transformer.wte.weight", table},
                                  {"transformer.ln_f.weight", values(dim, 1, 2)},
                                  {"transformer.ln_f.bias", values(dim, 1, 3)}};
  write_file(dir.path / "model.safetensors", f);  // as save_pretrained writes a tied model: no lm_head.weight
  f["lm_head.weight"] = head;
  fs::create_directories(dir.path / "with_head");
  write_file(dir.path / "with_head/model.safetensors", f);
  auto const mapping = sw::transformers_gpt2_mapping(dim);
  for (int ranks : {1, 2, 4}) {
    INFO("TP " << ranks);
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      Eigen::Index const rows = vocab / ranks;
      TiedModel model;
      sw::parallelize(model, tp);
      auto const report = sw::load_pretrained(model, tp, dir.path, mapping);  // strict
      CHECK(report.missing.empty());
      CHECK(report.unexpected.empty());
      CHECK(model.wte.weight == table.middleRows(tp.rank() * rows, rows));
      CHECK(model.lm_head.current_weight() == model.wte.weight);
      TiedModel other;
      sw::parallelize(other, tp);
      auto const with_head = sw::load_pretrained(other, tp, dir.path / "with_head", mapping, {.strict = false});
      CHECK(with_head.missing.empty());
      CHECK(with_head.unexpected == std::vector<std::string>{"lm_head.weight"});
      CHECK(other.lm_head.current_weight() == table.middleRows(tp.rank() * rows, rows));  // the file's copy unread
    });
  }
  std::string const message = error_of([&] {
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
      TiedModel model;
      sw::parallelize(model, tp);
      (void)sw::load_pretrained(model, tp, dir.path / "with_head", mapping);
    });
  });
  CHECK(message == "shardwise::load_pretrained: \"" + (dir.path / "with_head/model.safetensors").string() +
                       "\": the checkpoint's tensor \"lm_head.weight\" is the model's \"lm_head.weight\", which the "
                       "model ties to \"wte.weight\" (it computes with that tensor and does not read this one); load "
                       "the checkpoint into a model that does not tie them, or pass load_options{.strict = false} "
                       "to skip it");
  // A mapping that cannot name the tied weight (it throws for it) leaves the plain message.
  auto const no_head = [&](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "lm_head.weight") throw std::out_of_range("no lm_head here");
    return mapping(name);
  };
  CHECK(error_of([&] {
          sw::run_threads(1, [&](auto& world) {
            auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {1}));
            TiedModel model;
            sw::parallelize(model, tp);
            (void)sw::load_pretrained(model, tp, dir.path / "with_head", no_head);
          });
        }).find("the checkpoint's tensor \"lm_head.weight\" is not in the model (no model tensor reads it)") !=
        std::string::npos);
}

TEST_CASE("an error that is not shardwise's, agreed on by the tp group, is reported for the function that met it") {
  auto const expected = model_tensors();
  scratch_dir dir("agreed");
  write_file(dir.path / "model.safetensors", gpt2_file(expected));
  auto const throwing = [](std::string const& name) -> std::optional<sw::tensor_source> {
    if (name == "fc.bias") throw std::out_of_range("the user's mapping has no fc.bias");
    return gpt2_mapping(name);
  };
  // In turns and with rank 0 reading for all, the ranks agree on errors (no rank may wait for one that threw).
  for (sw::load_options const options :
       {sw::load_options{.ranks_per_step = 1}, sw::load_options{.only_rank0_reads = true}}) {
    INFO("ranks_per_step " << options.ranks_per_step << ", only_rank0_reads " << options.only_rank0_reads);
    std::string const message = error_of([&] {
      sw::run_threads(2, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
        Model model;
        sw::parallelize(model, tp);
        (void)sw::load_pretrained(model, tp, dir.path, throwing, options);
      });
    });
    std::string const said = "shardwise::load_pretrained: \"" + dir.path.string() +
                             "\": the user's mapping has no fc.bias (while checking the checkpoint against the model)";
    CHECK(message.substr(0, said.size()) == said);
    CHECK(message.find("previous checkpoint") == std::string::npos);
  }
  // A save still says that the checkpoint it would have replaced is untouched.
  std::ofstream(dir.path / "a_file") << "not a folder";
  std::string const message = error_of([&] {
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
      Model model;
      sw::parallelize(model, tp);
      sw::save_sharded(model, tp, dir.path / "a_file/ckpt", 1);
    });
  });
  std::string const said = "shardwise::save_sharded: \"" + (dir.path / "a_file/ckpt").string() + "\": ";
  CHECK(message.substr(0, said.size()) == said);
  CHECK(message.find("(while preparing the folder); the previous checkpoint is unchanged") != std::string::npos);
}
