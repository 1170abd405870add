// The shardwise half of the save_pretrained loading check (hf_checkpoints.py writes the folders): transformers'
// LlamaForCausalLM saved as one model.safetensors and as shards with model.safetensors.index.json, loaded with
// sw::load_pretrained through the Hugging Face names at TP 1, 2 and 4 on threads; the vocabulary-sharded logits,
// gathered, must equal transformers' to 1e-4 relative. The non-strict report must list what transformers'
// load_state_dict(strict=False) lists for a 3-layer and a 1-layer model. Prints "N passed, M failed" and exits
// non-zero when any check failed.
//
// usage: hf_checkpoint_load DIR
#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <shardwise/checkpoint/llama_names.hpp>
#include <shardwise/checkpoint/pretrained.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "npy.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

using Model = models::Llama<float, models::llama_plan<true>>;
constexpr double tolerance = 1e-4;  // fp32 on both sides

models::LlamaConfig config(std::size_t layers = 2) {  // hf_checkpoints.py's values
  models::LlamaConfig c;
  c.vocabulary = 64, c.dim = 32, c.layers = layers, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
  c.norm_eps = 1e-5, c.rope_theta = 10000.0;
  c.seed = 99;  // other values than transformers': everything compared must come from the files
  return c;
}

std::optional<sw::tensor_source> hf_names(std::string const& name) {
  return sw::tensor_source{sw::transformers_llama_name(name)};
}

struct checks {
  int passed = 0, failed = 0;
  void add(std::string const& name, bool ok, std::string const& detail = "") {
    (ok ? passed : failed) += 1;
    std::printf("%s %s%s%s\n", ok ? "ok  " : "FAIL", name.c_str(), ok || detail.empty() ? "" : "  ",
                ok ? "" : detail.c_str());
  }
  /// Runs fn, a check that may throw: a throw is a failure with its message.
  void run(std::string const& name, std::function<void()> const& fn) {
    try {
      fn();
    } catch (std::exception const& e) {
      add(name, false, e.what());
    }
  }
};

/// The largest difference from transformers' logits, relative to their largest magnitude.
double relative_error(sw::nn::matrix<float> const& got, npy::array const& expected) {
  if (got.rows() != expected.shape.at(0) || got.cols() != expected.shape.at(1)) return 1e30;
  double worst = 0, scale = 1e-30;
  for (Eigen::Index i = 0; i < got.rows(); ++i)
    for (Eigen::Index j = 0; j < got.cols(); ++j) {
      double const want = expected.data[static_cast<std::size_t>(i * got.cols() + j)];
      worst = std::max(worst, std::abs(double(got(i, j)) - want));
      scale = std::max(scale, std::abs(want));
    }
  return worst / scale;
}

/// Where a rank's model lives while it is checked: built eagerly, or declared lazily.
struct storage {
  std::optional<Model> model;
  std::optional<sw::Lazy<Model>> lazy;
};

/// Loads at TP `ranks` with `load(tp, storage) -> Model&` and compares the gathered logits with transformers'.
template <class Load>
void check_logits(checks& results, std::string const& name, int ranks, npy::array const& expected, Load&& load) {
  results.run(name, [&] {
    std::vector<std::int64_t> ids;  // hf_checkpoints.py's batch: 2 sequences of 8
    for (int i = 0; i < 16; ++i) ids.push_back((i * 7 + 3) % 64);
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      storage kept;
      Model& model = load(tp, kept);
      auto const logits = model.forward(ids);
      sw::nn::matrix<float> whole;
      sw::all_gather(tp, logits.local, whole, -1);
      if (world.rank() != 0) return;
      double const error = relative_error(whole, expected);
      char shown[48];
      std::snprintf(shown, sizeof shown, " (relative error %.2g)", error);
      results.add(name + shown, error <= tolerance);
    });
  });
}

std::vector<std::string> sorted(std::vector<std::string> v) {
  std::sort(v.begin(), v.end());
  return v;
}

std::string joined(std::vector<std::string> const& v) {
  std::string s;
  for (auto const& x : v) s += (s.empty() ? "" : ", ") + x;
  return "[" + s + "]";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: hf_checkpoint_load DIR\n");
    return 2;
  }
  fs::path const dir = argv[1];
  checks results;
  npy::array const expected = npy::read(dir / "logits.npy");

  for (int ranks : {1, 2, 4}) {
    std::string const at = " at TP " + std::to_string(ranks);
    check_logits(results, "model.safetensors" + at, ranks, expected, [&](auto const& tp, storage& kept) -> Model& {
      auto& model = kept.model.emplace(config());
      sw::parallelize(model, tp);
      auto const report = sw::load_pretrained(model, tp, dir / "single", hf_names);
      if (tp.rank() == 0)
        results.add("model.safetensors" + at + ": nothing missing or unexpected, metadata",
                    report.missing.empty() && report.unexpected.empty() && report.metadata.count("format"),
                    joined(report.missing) + " " + joined(report.unexpected));
      return model;
    });
    check_logits(results, "sharded folder with model.safetensors.index.json, into sw::Lazy" + at, ranks, expected,
                 [&](auto const& tp, storage& kept) -> Model& {
                   auto& lazy = kept.lazy.emplace(config());
                   sw::parallelize(lazy, tp);
                   sw::load_report report;
                   Model& model = sw::load_pretrained(lazy, tp, dir / "sharded", hf_names, {}, &report);
                   if (tp.rank() == 0)
                     results.add(
                         "sharded folder" + at + ": nothing missing or unexpected, the index's metadata",
                         report.missing.empty() && report.unexpected.empty() && report.metadata.count("total_size"),
                         joined(report.missing) + " " + joined(report.unexpected));
                   return model;
                 });
  }
  check_logits(results, "sharded folder, only_rank0_reads, at TP 4", 4, expected,
               [&](auto const& tp, storage& kept) -> Model& {
                 auto& model = kept.model.emplace(config());
                 sw::parallelize(model, tp);
                 (void)sw::load_pretrained(model, tp, dir / "sharded", hf_names, {.only_rank0_reads = true});
                 return model;
               });
  check_logits(results, "load_consolidated with transformers_llama_name (renames only), at TP 2", 2, expected,
               [&](auto const& tp, storage& kept) -> Model& {
                 auto& model = kept.model.emplace(config());
                 sw::parallelize(model, tp);
                 (void)sw::load_consolidated(model, tp, dir / "single/model.safetensors", sw::transformers_llama_name);
                 return model;
               });

  // Non-strict: the same lists as transformers' load_state_dict(strict=False), in Hugging Face's names.
  nlohmann::json const reference = nlohmann::json::parse(std::ifstream(dir / "report.json"));
  for (std::size_t layers : {3u, 1u}) {
    std::string const name = "non-strict report into a " + std::to_string(layers) + "-layer model, as transformers'";
    results.run(name, [&] {
      sw::run_threads(2, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
        Model model(config(layers));
        sw::parallelize(model, tp);
        auto const report = sw::load_pretrained(model, tp, dir / "sharded", hf_names, {.strict = false});
        if (world.rank() != 0) return;
        std::vector<std::string> missing;
        for (auto const& m : report.missing) missing.push_back(sw::transformers_llama_name(m));
        auto const& want = reference.at(std::to_string(layers));
        bool const same = sorted(missing) == want.at("missing").get<std::vector<std::string>>() &&
                          sorted(report.unexpected) == want.at("unexpected").get<std::vector<std::string>>();
        results.add(name, same && (missing.size() + report.unexpected.size()) > 0,
                    "missing " + joined(sorted(missing)) + ", unexpected " + joined(sorted(report.unexpected)) +
                        "; transformers: " + want.dump());
      });
    });
  }
  // Strict (the default): the first unread tensor is an error naming it and the fix.
  results.run("strict load into a 1-layer model refused", [&] {
    std::string message;
    try {
      sw::run_threads(2, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
        Model model(config(1));
        sw::parallelize(model, tp);
        (void)sw::load_pretrained(model, tp, dir / "sharded", hf_names);
      });
    } catch (sw::error const& e) {
      message = e.what();
    }
    results.add("strict load into a 1-layer model refused",
                message.find("the checkpoint's tensor \"model.layers.1.") != std::string::npos &&
                    message.find("load_options{.strict = false}") != std::string::npos,
                message);
  });

  std::printf("%d passed, %d failed\n", results.passed, results.failed);
  return results.failed == 0 && results.passed > 0 ? 0 : 1;
}
