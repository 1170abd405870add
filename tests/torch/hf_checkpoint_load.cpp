// The shardwise half of the save_pretrained loading check (hf_checkpoints.py writes the folders): transformers'
// LlamaForCausalLM saved as one model.safetensors and as shards with model.safetensors.index.json, loaded with
// sw::load_pretrained through the Hugging Face names at TP 1, 2 and 4 on threads; the vocabulary-sharded logits,
// gathered, must equal transformers' to 1e-4 relative. The non-strict report must list what transformers'
// load_state_dict(strict=False) lists for a 3-layer and a 1-layer model. The same logits check for a
// LlamaForCausalLM with tie_word_embeddings=True (no lm_head.weight in the file: the strict load passes; the
// untied file's lm_head.weight is unexpected, and when strict an error saying the model ties it) and for a
// GPT2LMHeadModel through sw::transformers_gpt2_mapping (one file and a sharded folder, with and without
// sequence parallelism). Every rank reads its own shard (checkpoint_load_hook). Prints "N passed, M failed" and
// exits non-zero when any check failed.
//
// usage: hf_checkpoint_load DIR
#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/checkpoint/pretrained.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/inference.hpp>
#include <shardwise/models/gpt2_names.hpp>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/nn/experts/expert_parallel.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "npy.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

using Model = models::Llama<float, models::llama_plan<true>>;
template <bool SequenceParallel>
using GPT2 = models::GPT2<float, models::gpt2_plan<SequenceParallel>>;
constexpr double tolerance = 1e-4;  // fp32 on both sides

models::LlamaConfig config(std::size_t layers = 2, bool tied = false) {  // hf_checkpoints.py's values
  models::LlamaConfig c;
  c.vocabulary = 64, c.dim = 32, c.layers = layers, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
  c.norm_eps = 1e-5, c.rope_theta = 10000.0;
  c.tie_word_embeddings = tied;
  c.seed = 99;  // other values than transformers': everything compared must come from the files
  return c;
}

models::GPT2Config gpt2_config() {  // hf_checkpoints.py's GPT2Config
  models::GPT2Config c;
  c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.sequence = 8, c.layer_norm_eps = 1e-5;
  c.seed = 99;
  return c;
}

/// How many times each tp rank started reading its shard (checkpoint_load_hook's "read_begin").
std::array<std::atomic<int>, 4> reads_begun{};
void count_reads(std::string_view stage, int tp_rank) {
  if (stage == "read_begin") reads_begun.at(static_cast<std::size_t>(tp_rank)) += 1;
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
template <class M = Model>
struct storage {
  std::optional<M> model;
  std::optional<sw::Lazy<M>> lazy;
};

/// Loads at TP `ranks` with `load(tp, storage<M>) -> M&` and compares the gathered logits with transformers'.
/// With `differ`, the check is that they do not match (a wrong load must show).
template <class M = Model, class Load>
void check_logits(checks& results, std::string const& name, int ranks, npy::array const& expected, Load&& load,
                  bool differ = false) {
  results.run(name, [&] {
    std::vector<std::int64_t> ids;  // hf_checkpoints.py's batch: 2 sequences of 8
    for (int i = 0; i < 16; ++i) ids.push_back((i * 7 + 3) % 64);
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      storage<M> kept;
      M& model = load(tp, kept);
      auto const logits = model.forward(ids);
      sw::nn::matrix<float> whole;
      sw::all_gather(tp, logits.local, whole, -1);
      if (world.rank() != 0) return;
      double const error = relative_error(whole, expected);
      char shown[48];
      std::snprintf(shown, sizeof shown, " (relative error %.2g)", error);
      results.add(name + shown, differ ? error > 100 * tolerance : error <= tolerance);
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

/// The largest difference from `expected`, relative to its largest magnitude (at least 1e-30).
double relative_error(std::vector<double> const& got, npy::array const& expected) {
  if (got.size() != expected.data.size()) return 1e30;
  double worst = 0, scale = 1e-30;
  for (std::size_t i = 0; i < got.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - expected.data[i])), scale = std::max(scale, std::abs(expected.data[i]));
  return worst / scale;
}

/// ", relative error 1.2e-15".
std::string shown(double error) {
  char text[48];
  std::snprintf(text, sizeof text, ", relative error %.2g", error);
  return text;
}

/// Two sequences of 8 tokens (moe_checkpoints.py's batches).
std::vector<std::int64_t> moe_ids(int step, bool targets) {
  std::vector<std::int64_t> ids;
  for (int i = 0; i < 16; ++i) ids.push_back((step * 31 + i * 7 + (targets ? 3 : 0)) % 64);
  return ids;
}

/// Row `row` of moe_checkpoints.py's batches of 2 or 4 rows (moe_ids' for rows 0 and 1): the 8 tokens a
/// data-parallel rank of its reference holds.
std::vector<std::int64_t> moe_row(int step, int row, bool targets) {
  std::vector<std::int64_t> ids;
  for (int i = 8 * row; i < 8 * (row + 1); ++i) ids.push_back((step * 31 + i * 7 + (targets ? 3 : 0)) % 64);
  return ids;
}

/// moe_checkpoints.py's torch.optim.AdamW.
constexpr sw::AdamWOptions<double> moe_adamw{
    .learning_rate = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};

/// The relative gap of rank `row`'s loss at `step` to transformers' in moe_checkpoints.py's data-parallel losses
/// `expected` ([step][row] of `rows` rows).
double row_gap(npy::array const& expected, int rows, int step, int row, double loss) {
  double const want = expected.data.at(static_cast<std::size_t>(step * rows + row));
  return std::abs(loss - want) / std::abs(want);
}

/// Records `label`'s worst row gap (on the rank that calls it).
void add_row_gaps(checks& results, std::string const& label, double worst) {
  results.add(
      label + ": each rank's 5 AdamW steps' losses equal transformers + DDP's for its row (fp64" + shown(worst) + ")",
      worst <= 1e-10);
}

/// A mixture of experts whose attention the plan cuts over tp (its experts stay whole on every rank).
using MoeModel = models::MoeLlama<double, models::moe_llama_plan<>>;

/// The rows of a rank's vocabulary-sharded logits, gathered, as one list (npy's row-by-row order).
template <class Tp, class Logits>
std::vector<double> gathered_rows(Tp const& tp, Logits const& logits) {
  sw::nn::matrix<double> whole;
  sw::all_gather(tp, logits.local, whole, -1);
  std::vector<double> rows;
  for (Eigen::Index i = 0; i < whole.rows(); ++i)
    for (Eigen::Index j = 0; j < whole.cols(); ++j) rows.push_back(whole(i, j));
  return rows;
}

/// Loads the folder moe_checkpoints.py saved for `family` (`folder`: its files, whose expert names are found) at tp
/// `ranks` on threads, and compares with transformers in fp64: the logits and the aux loss of batch 0 (1e-12), and
/// the losses of 5 AdamW steps on cross-entropy + router_aux_loss_coef x aux (1e-10). At tp 1, saves the trained
/// model as `folder`_export in the folder's layout (per-expert names, Mixtral's for Mixtral, transformers 5's fused
/// experts for mixtral_fused) with its logits of batch 0, for moe_checkpoints.py's from_pretrained.
void check_moe_family(checks& results, fs::path const& dir, std::string const& family, std::string const& folder,
                      int ranks) {
  std::string const label = folder + " at tp " + std::to_string(ranks);
  results.run(label + ": load_pretrained", [&] {
    models::LlamaConfig const c = models::read_llama_config(dir / folder / "config.json");
    if (!c.moe) return results.add(label + ": config.json read with experts", false);
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
      auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
      bool const writer = world.rank() == 0;
      sw::Lazy<MoeModel> lazy(c);
      sw::parallelize(lazy, tp);
      auto const names = sw::transformers_experts_in(dir / folder);
      MoeModel& model =
          sw::load_pretrained(lazy, tp, dir / folder, sw::transformers_llama_mapping(names, c.moe->expert_hidden));
      double const logits_error = relative_error(gathered_rows(tp, model.forward(moe_ids(0, false))),
                                                 npy::read(dir / (family + "_logits.npy")));
      double const aux_error = relative_error({model.router_aux_loss()}, npy::read(dir / (family + "_aux.npy")));
      sw::AdamW<double> optimizer(
          {.learning_rate = 1e-2, .beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
      std::vector<double> losses;
      for (int step = 0; step < 5; ++step) {
        auto const result =
            models::llama_loss(tp, model.forward(moe_ids(step, false)), moe_ids(step, true), c.vocabulary);
        losses.push_back(result.loss + c.moe->router_aux_loss_coef * model.router_aux_loss());
        model.backward(result.dlogits);
        optimizer.step(sw::finish_gradients(model), dp);
        sw::zero_grad(model);
      }
      double const losses_error = relative_error(losses, npy::read(dir / (family + "_losses.npy")));
      if (writer) {
        results.add(label + ": logits equal transformers' (fp64" + shown(logits_error) + ")", logits_error <= 1e-12);
        results.add(label + ": aux_loss equals transformers' (fp64" + shown(aux_error) + ")", aux_error <= 1e-12);
        results.add(
            label + ": 5 AdamW steps' losses equal transformers + torch.optim.AdamW (fp64" + shown(losses_error) + ")",
            losses_error <= 1e-10);
      }
      if (ranks != 1) return;  // exported once per folder, trained, with its logits of batch 0, in the folder's layout
      fs::path const out = dir / (folder + "_export");  // the fused experts too: gate_up_proj and down_proj stacked
      fs::create_directories(out);
      npy::write(out / "logits.npy", sw::nn::matrix<double>(model.forward(moe_ids(0, false)).local));
      sw::save_sharded(model, tp, out / "sharded", 5);
      sw::consolidate(out / "sharded", out / "model.safetensors",
                      {.mapping = sw::transformers_llama_mapping(names, c.moe->expert_hidden)});
      models::write_llama_config(model.config(), out / "config.json");
      fs::remove_all(out / "sharded");
    });
  });
}

/// The folder of `family` trained as moe_checkpoints.py's data-parallel reference: 2 ranks, each one row of the
/// batch, the experts placed over them (sw::expert_parallelize over the data-parallel mesh); each rank's loss at each
/// of 5 AdamW steps equals transformers' for its row (fp64, 1e-10), on threads.
void check_moe_expert_parallel(checks& results, fs::path const& dir, std::string const& family) {
  std::string const label = family + " with its experts over ep 2 (the data-parallel ranks, a row each)";
  results.run(label, [&] {
    models::LlamaConfig const c = models::read_llama_config(dir / family / "config.json");
    npy::array const expected = npy::read(dir / (family + "_dp_losses.npy"));  // [step][row]
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1}));
      auto const dp = sw::make_mesh<"dp">(world, {2});
      sw::Lazy<MoeModel> lazy(c);
      sw::parallelize(lazy, tp);
      MoeModel& model = sw::load_pretrained(lazy, tp, dir / family,
                                            sw::transformers_llama_mapping(sw::transformers_experts_in(dir / family)));
      (void)sw::expert_parallelize(model, dp);
      sw::AdamW<double> optimizer(moe_adamw);
      int const row = world.rank();
      std::vector<double> got, want;
      for (int step = 0; step < 5; ++step) {
        auto const result =
            models::llama_loss(tp, model.forward(moe_row(step, row, false)), moe_row(step, row, true), c.vocabulary);
        got.push_back(result.loss + c.moe->router_aux_loss_coef * model.router_aux_loss());
        want.push_back(expected.data.at(static_cast<std::size_t>(step * 2 + row)));
        model.backward(result.dlogits);
        optimizer.step(sw::finish_gradients(model), dp);
        sw::zero_grad(model);
      }
      std::string refused;  // without the ep ranks, a save of each rank's share alone would lose the others'
      try {
        sw::save_sharded(model, tp, dir / (family + "_ep_checkpoint"), 5);
      } catch (sw::error const& e) {
        refused = e.what();
      }
      bool const save_refused =
          refused.find("save it with its optimizer on every data-parallel (ep) rank") != std::string::npos;
      // With the optimizer's state, every ep rank writes its experts; loaded at ep 1, each rank holds them all.
      sw::save_sharded(model, optimizer, tp, dp, dir / (family + "_ep_state"), 5);
      MoeModel whole(c);
      sw::parallelize(whole, tp);
      sw::AdamW<double> whole_optimizer(optimizer.options());
      (void)sw::load_sharded(whole, whole_optimizer, tp, dp, dir / (family + "_ep_state"));
      auto const ids = moe_row(5, row, false);
      auto const expected_logits = whole.forward(ids).local;
      double const logits_gap =
          (model.forward(ids).local - expected_logits).cwiseAbs().maxCoeff() / expected_logits.cwiseAbs().maxCoeff();
      if (row == 0)
        results.add(label + ": saved with its optimizer at ep 2 and loaded at ep 1, the same logits (fp64" +
                        shown(logits_gap) + ", within 1e-13) and step count; without the optimizer, refused by name",
                    save_refused && logits_gap <= 1e-13 && whole_optimizer.steps() == 5, refused);
      Eigen::VectorXd worst = Eigen::VectorXd::Zero(1);  // over both ranks' rows
      for (std::size_t i = 0; i < got.size(); ++i)
        worst(0) = std::max(worst(0), std::abs(got[i] - want[i]) / std::abs(want[i]));
      sw::all_reduce(dp, worst, sw::Max{});
      if (row == 0) add_row_gaps(results, label, worst(0));
    });
  });
}

/// The folder of `family` trained as moe_checkpoints.py's data-parallel reference of `ep` ranks (a row each) with
/// its experts over them, the model cut over tp `tp` by Plan (moe_llama_plan<true, true>: each expert's SwiGLU too,
/// expert tensor parallelism); ep x tp threads: each rank's loss at each of 5 AdamW steps equals transformers' for
/// its row (fp64, 1e-10).
template <class Plan>
void check_moe_placed_rows(checks& results, fs::path const& dir, std::string const& family, int ep, int tp_size) {
  std::string const label = family + " with its experts over ep " + std::to_string(ep) +
                            (tp_size > 1 ? " and cut over tp " + std::to_string(tp_size) : std::string()) +
                            " (the data-parallel ranks, a row each)";
  results.run(label, [&] {
    models::LlamaConfig const c = models::read_llama_config(dir / family / "config.json");
    npy::array const expected =
        npy::read(dir / (family + (ep == 2 ? "_dp_losses.npy" : "_dp" + std::to_string(ep) + "_losses.npy")));
    sw::run_threads(ep * tp_size, [&](auto& world) {
      auto const mesh = sw::make_mesh<"dp", "tp">(world, {ep, tp_size});
      auto const dp = sw::submesh<"dp">(mesh);
      auto const tp = sw::submesh<"tp">(mesh);
      using Model = models::MoeLlama<double, Plan>;
      sw::Lazy<Model> lazy(c);
      sw::parallelize(lazy, tp);
      Model& model = sw::load_pretrained(lazy, tp, dir / family,
                                         sw::transformers_llama_mapping(sw::transformers_experts_in(dir / family)));
      (void)sw::expert_parallelize(model, dp);
      sw::AdamW<double> optimizer(moe_adamw);
      int const row = dp.rank();
      Eigen::VectorXd worst = Eigen::VectorXd::Zero(1);  // over every row
      for (int step = 0; step < 5; ++step) {
        auto const result =
            models::llama_loss(tp, model.forward(moe_row(step, row, false)), moe_row(step, row, true), c.vocabulary);
        double const loss = result.loss + c.moe->router_aux_loss_coef * model.router_aux_loss();
        model.backward(result.dlogits);
        optimizer.step(sw::finish_gradients(model), dp);
        sw::zero_grad(model);
        worst(0) = std::max(worst(0), row_gap(expected, ep, step, row, loss));
      }
      sw::all_reduce(dp, worst, sw::Max{});
      if (world.rank() == 0) add_row_gaps(results, label, worst(0));
    });
  });
}

/// The folder of `family` trained as moe_checkpoints.py's data-parallel reference in two pipeline stages
/// (models::MoeLlamaStage) with its experts over ep 2 (the data-parallel ranks, a row each; pp 2 x ep 2 on 4 threads):
/// each rank's loss at each of 5 AdamW steps, the load-balancing loss pooled over both stages' blocks, equals
/// transformers' for its row (fp64, 1e-10).
void check_moe_pipeline(checks& results, fs::path const& dir, std::string const& family) {
  std::string const label = family + " in 2 pipeline stages with its experts over ep 2 (pp 2 x ep 2, a row each)";
  results.run(label, [&] {
    models::LlamaConfig const c = models::read_llama_config(dir / family / "config.json");
    npy::array const expected = npy::read(dir / (family + "_dp_losses.npy"));  // [step][row]
    // A stage reads the folder through a sharded checkpoint of the whole model (load_pretrained reads into whole
    // models only: a stage's strict load would find the other stage's tensors unexpected).
    fs::path const source = dir / (family + "_pp_source");
    {
      auto const alone = sw::make_mesh<"tp">(sw::serial_world(), {1});
      MoeModel whole(c);
      (void)sw::load_pretrained(whole, alone, dir / family,
                                sw::transformers_llama_mapping(sw::transformers_experts_in(dir / family)));
      sw::save_sharded(whole, alone, source, 0);
    }
    sw::run_threads(4, [&](auto& world) {
      auto const mesh = sw::make_mesh<"dp", "pp">(world, {2, 2});
      auto const dp = sw::submesh<"dp">(mesh);
      auto const pp = sw::submesh<"pp">(mesh);
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1}));
      models::MoeLlamaStage<double> stage(c, sw::stage_split(c.layers, 2), pp.rank());
      (void)sw::load_sharded(stage, tp, source);  // each stage its own blocks, strictly
      (void)sw::expert_parallelize(stage, dp);
      sw::AdamW<double> optimizer(moe_adamw);
      int const row = dp.rank();
      Eigen::VectorXd worst = Eigen::VectorXd::Zero(1);  // over both rows
      for (int step = 0; step < 5; ++step) {
        double loss = 0;
        sw::run_pipeline_step(
            sw::OneFOneB{}, pp, std::span(&stage, 1), 1, [&](int) { return moe_row(step, row, false); },
            [&](int, auto const& h) {
              auto result = stage.head_loss(tp, h, moe_row(step, row, true));
              loss = result.loss + c.moe->router_aux_loss_coef * stage.router_aux_loss();
              return result.gradient;
            });
        optimizer.step(sw::finish_gradients(stage), dp, pp);
        sw::zero_grad(stage);
        loss = sw::all_reduce(pp, stage.is_last() ? loss : 0.0, sw::Sum{});
        worst(0) = std::max(worst(0), row_gap(expected, 2, step, row, loss));
      }
      sw::all_reduce(dp, worst, sw::Max{});
      sw::all_reduce(pp, worst, sw::Max{});
      if (world.rank() == 0) add_row_gaps(results, label, worst(0));
    });
  });
}

/// The folder of `family` trained as moe_checkpoints.py's data-parallel reference with its experts over ep 2 drawn
/// from dp 2 and every other parameter fully sharded over dp (sw::fully_shard, a unit per block): each rank's loss at
/// each of 5 AdamW steps equals transformers' for its row (fp64, 1e-10), on threads.
void check_moe_fully_sharded(checks& results, fs::path const& dir, std::string const& family) {
  std::string const label = family + " with its experts over ep 2 drawn from dp 2, the rest under FSDP (a row each)";
  results.run(label, [&] {
    models::LlamaConfig const c = models::read_llama_config(dir / family / "config.json");
    npy::array const expected = npy::read(dir / (family + "_dp_losses.npy"));  // [step][row]
    sw::run_threads(2, [&](auto& world) {
      auto const alone = sw::make_mesh<"tp">(sw::serial_world(), {1});
      auto const layout = sw::make_mesh<"edp", "ep">(world, {1, 2});
      auto const dp = sw::make_mesh<"dp">(world, {2});
      models::MoeLlama<double> model(c);
      (void)sw::load_pretrained(model, alone, dir / family,
                                sw::transformers_llama_mapping(sw::transformers_experts_in(dir / family)));
      (void)sw::expert_parallelize(model, sw::submesh<"ep">(layout), sw::submesh<"edp">(layout));
      auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
      sw::AdamW<double> optimizer(moe_adamw);
      int const row = dp.rank();
      Eigen::VectorXd worst = Eigen::VectorXd::Zero(1);  // over both rows
      for (int step = 0; step < 5; ++step) {
        auto const result = models::llama_loss(alone, sharded.forward(moe_row(step, row, false)),
                                               moe_row(step, row, true), c.vocabulary);
        double const loss = result.loss + c.moe->router_aux_loss_coef * sharded.model().router_aux_loss();
        sharded.backward(result.dlogits);
        optimizer.step(sharded);
        sw::zero_grad(sharded);
        worst(0) = std::max(worst(0), row_gap(expected, 2, step, row, loss));
      }
      sw::all_reduce(dp, worst, sw::Max{});
      if (row == 0) add_row_gaps(results, label, worst(0));
    });
  });
}

/// The folder of `family` generating greedily with its experts placed over ep 2, both ranks the same prompts: the
/// tokens equal transformers' generate after each prompt (moe_checkpoints.py's greedy), token for token.
void check_moe_generation(checks& results, fs::path const& dir, std::string const& family) {
  std::string const label = family + " generating greedily with its experts over ep 2";
  results.run(label, [&] {
    models::LlamaConfig const c = models::read_llama_config(dir / family / "config.json");
    npy::array const expected = npy::read(dir / (family + "_greedy.npy"));  // [prompt][new token]
    std::vector<std::vector<std::int64_t>> const prompts{{3, 17, 42}, {9, 1, 60}};
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1}));
      sw::Lazy<MoeModel> lazy(c);
      sw::parallelize(lazy, tp);
      MoeModel& model = sw::load_pretrained(lazy, tp, dir / family,
                                            sw::transformers_llama_mapping(sw::transformers_experts_in(dir / family)));
      (void)sw::expert_parallelize(model, sw::make_mesh<"ep">(world, {2}));
      auto const got = sw::generate(model, tp, prompts, {.max_new_tokens = 5}).tokens;
      bool same = expected.shape == std::vector<long>{2, 5};
      std::string shown_tokens;
      for (std::size_t p = 0; p < got.size(); ++p)
        for (std::size_t t = 0; t < got[p].size(); ++t) {
          shown_tokens += (t ? " " : p ? "; " : "") + std::to_string(got[p][t]);
          same = same && t < 5 && got[p][t] == static_cast<std::int64_t>(expected.data.at(p * 5 + t));
        }
      if (world.rank() == 0)
        results.add(label + ": its tokens equal transformers' generate, token for token", same, shown_tokens);
      std::string refused;  // the folder again, into the placed experts: refused by name, not read half
      try {
        (void)sw::load_pretrained(model, tp, dir / family,
                                  sw::transformers_llama_mapping(sw::transformers_experts_in(dir / family)));
      } catch (sw::error const& e) {
        refused = e.what();
      }
      if (world.rank() == 0)
        results.add(label + ": a load of the folder into the placed experts refused by name",
                    refused.find("a load of full tensors into placed experts is not built yet") != std::string::npos,
                    refused);
    });
  });
}

/// A copy of the folder of `family` whose config.json says `experts` experts: its load must be refused on every
/// rank, naming the router, whose shape does not fit.
void check_expert_count_disagrees(checks& results, fs::path const& dir, std::string const& family, int experts,
                                  std::string const& named) {
  std::string const label = family + " with a config.json of " + std::to_string(experts) + " experts";
  results.run(label, [&] {
    fs::path const copy = dir / (family + "_" + std::to_string(experts) + "_experts");
    fs::remove_all(copy);
    fs::copy(dir / family, copy);
    nlohmann::json config = nlohmann::json::parse(std::ifstream(copy / "config.json"));
    config[config.contains("num_local_experts") ? "num_local_experts" : "num_experts"] = experts;
    std::ofstream(copy / "config.json") << config.dump();
    models::LlamaConfig const c = models::read_llama_config(copy / "config.json");
    std::string message;
    try {
      sw::run_threads(2, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
        sw::Lazy<MoeModel> lazy(c);
        sw::parallelize(lazy, tp);
        (void)sw::load_pretrained(lazy, tp, copy, sw::transformers_llama_mapping());
      });
    } catch (sw::error const& e) {
      message = e.what();
    }
    results.add(label + ": refused, naming " + named, message.find(named) != std::string::npos, message);
  });
}

/// The mixture-of-experts folders of moe_checkpoints.py (DIR given with --moe).
void check_moe(checks& results, fs::path const& dir) {
  for (int ranks : {1, 2}) {
    for (std::string const family : {"mixtral", "qwen3_moe", "qwen2_moe"})
      check_moe_family(results, dir, family, family, ranks);
    check_moe_family(results, dir, "mixtral", "mixtral_fused", ranks);
  }
  for (std::string const family : {"mixtral", "qwen3_moe", "qwen2_moe"}) {
    check_moe_expert_parallel(results, dir, family);
    check_moe_placed_rows<sw::serial_plan>(results, dir, family, 4, 1);
    check_moe_placed_rows<models::moe_llama_plan<true, true>>(results, dir, family, 2, 2);
    check_moe_pipeline(results, dir, family);
    check_moe_fully_sharded(results, dir, family);
    check_moe_generation(results, dir, family);
  }
  check_expert_count_disagrees(results, dir, "qwen3_moe", 6,
                               "\"layers.0.feed_forward.gate.weight\" has shape [6, 32] in the model but [8, 32]");
  check_expert_count_disagrees(results, dir, "qwen3_moe", 10,
                               "\"layers.0.feed_forward.gate.weight\" has shape [10, 32] in the model but [8, 32]");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[1]) == "--moe") {
    checks results;
    check_moe(results, argv[2]);
    std::printf("%d passed, %d failed\n", results.passed, results.failed);
    return results.failed == 0 && results.passed > 0 ? 0 : 1;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: hf_checkpoint_load DIR | hf_checkpoint_load --moe DIR\n");
    return 2;
  }
  fs::path const dir = argv[1];
  checks results;
  npy::array const expected = npy::read(dir / "logits.npy");

  for (int ranks : {1, 2, 4}) {
    std::string const at = " at TP " + std::to_string(ranks);
    check_logits(results, "model.safetensors" + at, ranks, expected, [&](auto const& tp, storage<>& kept) -> Model& {
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
                 [&](auto const& tp, storage<>& kept) -> Model& {
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
               [&](auto const& tp, storage<>& kept) -> Model& {
                 auto& model = kept.model.emplace(config());
                 sw::parallelize(model, tp);
                 (void)sw::load_pretrained(model, tp, dir / "sharded", hf_names, {.only_rank0_reads = true});
                 return model;
               });
  check_logits(results, "load_consolidated with transformers_llama_name (renames only), at TP 2", 2, expected,
               [&](auto const& tp, storage<>& kept) -> Model& {
                 auto& model = kept.model.emplace(config());
                 sw::parallelize(model, tp);
                 (void)sw::load_consolidated(model, tp, dir / "single/model.safetensors", sw::transformers_llama_name);
                 return model;
               });

  // LlamaForCausalLM(tie_word_embeddings=True): save_pretrained wrote no lm_head.weight; the strict load reads the
  // one table as tok_embeddings.weight, and the output projection computes with it.
  npy::array const tied_expected = npy::read(dir / "tied_logits.npy");
  for (int ranks : {1, 2, 4}) {
    std::string const at = " at TP " + std::to_string(ranks);
    check_logits(results, "tied Llama, model.safetensors" + at, ranks, tied_expected,
                 [&](auto const& tp, storage<>& kept) -> Model& {
                   auto& model = kept.model.emplace(config(2, true));
                   sw::parallelize(model, tp);
                   auto const report = sw::load_pretrained(model, tp, dir / "tied", hf_names);
                   if (tp.rank() == 0)
                     results.add("tied Llama" + at + ": strict, nothing missing or unexpected",
                                 report.missing.empty() && report.unexpected.empty(),
                                 joined(report.missing) + " " + joined(report.unexpected));
                   return model;
                 });
  }
  check_logits(results, "tied Llama into sw::Lazy, in turns of one rank, at TP 4", 4, tied_expected,
               [&](auto const& tp, storage<>& kept) -> Model& {
                 auto& lazy = kept.lazy.emplace(config(2, true));
                 sw::parallelize(lazy, tp);
                 return sw::load_pretrained(lazy, tp, dir / "tied", hf_names, {.ranks_per_step = 1});
               });
  // A file that does carry lm_head.weight (the untied model's) for the tied model: not read.
  results.run("tied Llama, a file with lm_head.weight, non-strict: reported unexpected", [&] {
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
      Model model(config(2, true));
      sw::parallelize(model, tp);
      auto const report = sw::load_pretrained(model, tp, dir / "single", hf_names, {.strict = false});
      if (world.rank() != 0) return;
      results.add("tied Llama, a file with lm_head.weight, non-strict: reported unexpected",
                  report.missing.empty() && report.unexpected == std::vector<std::string>{"lm_head.weight"},
                  joined(report.missing) + " " + joined(report.unexpected));
    });
  });
  results.run("tied Llama, a file with lm_head.weight, strict: an error saying the model ties it", [&] {
    std::string message;
    try {
      sw::run_threads(2, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {2}));
        Model model(config(2, true));
        sw::parallelize(model, tp);
        (void)sw::load_pretrained(model, tp, dir / "single", hf_names);
      });
    } catch (sw::error const& e) {
      message = e.what();
    }
    std::printf("     %s\n", message.c_str());
    results.add("tied Llama, a file with lm_head.weight, strict: an error saying the model ties it",
                message.find("the checkpoint's tensor \"lm_head.weight\" is the model's \"output.weight\", which the "
                             "model ties to \"tok_embeddings.weight\"") != std::string::npos,
                message);
  });

  // GPT2LMHeadModel (lm_head tied to wte, left out of the file) through sw::transformers_gpt2_mapping.
  npy::array const gpt2_expected = npy::read(dir / "gpt2_logits.npy");
  auto const gpt2_mapping = sw::transformers_gpt2_mapping(gpt2_config().dim);
  for (int ranks : {1, 2, 4}) {
    std::string const at = " at TP " + std::to_string(ranks);
    check_logits<GPT2<false>>(
        results, "GPT-2, model.safetensors" + at, ranks, gpt2_expected,
        [&](auto const& tp, storage<GPT2<false>>& kept) -> GPT2<false>& {
          auto& model = kept.model.emplace(gpt2_config());
          sw::parallelize(model, tp);
          auto const report = sw::load_pretrained(model, tp, dir / "gpt2", gpt2_mapping);
          if (tp.rank() == 0)
            results.add("GPT-2" + at + ": strict, nothing missing or unexpected, metadata",
                        report.missing.empty() && report.unexpected.empty() && report.metadata.count("format"),
                        joined(report.missing) + " " + joined(report.unexpected));
          return model;
        });
    check_logits<GPT2<false>>(
        results, "GPT-2, sharded folder with model.safetensors.index.json, into sw::Lazy" + at, ranks, gpt2_expected,
        [&](auto const& tp, storage<GPT2<false>>& kept) -> GPT2<false>& {
          auto& lazy = kept.lazy.emplace(gpt2_config());
          sw::parallelize(lazy, tp);
          sw::load_report report;
          auto& model = sw::load_pretrained(lazy, tp, dir / "gpt2_sharded", gpt2_mapping, {}, &report);
          if (tp.rank() == 0)
            results.add("GPT-2 sharded folder" + at + ": nothing missing or unexpected, the index's metadata",
                        report.missing.empty() && report.unexpected.empty() && report.metadata.count("total_size"),
                        joined(report.missing) + " " + joined(report.unexpected));
          return model;
        });
  }
  for (int ranks : {2, 4})
    check_logits<GPT2<true>>(results, "GPT-2 with sequence parallelism, at TP " + std::to_string(ranks), ranks,
                             gpt2_expected, [&](auto const& tp, storage<GPT2<true>>& kept) -> GPT2<true>& {
                               auto& model = kept.model.emplace(gpt2_config());
                               sw::parallelize(model, tp);
                               (void)sw::load_pretrained(model, tp, dir / "gpt2_sharded", gpt2_mapping);
                               return model;
                             });
  check_logits<GPT2<false>>(results, "GPT-2, only_rank0_reads, at TP 4", 4, gpt2_expected,
                            [&](auto const& tp, storage<GPT2<false>>& kept) -> GPT2<false>& {
                              auto& model = kept.model.emplace(gpt2_config());
                              sw::parallelize(model, tp);
                              (void)sw::load_pretrained(model, tp, dir / "gpt2", gpt2_mapping,
                                                        {.only_rank0_reads = true});
                              return model;
                            });

  // The comparison sees a wrong load: q and k swapped in the mapping.
  check_logits<GPT2<false>>(
      results, "GPT-2 through a mapping that swaps q and k differs, at TP 2", 2, gpt2_expected,
      [&](auto const& tp, storage<GPT2<false>>& kept) -> GPT2<false>& {
        auto& model = kept.model.emplace(gpt2_config());
        sw::parallelize(model, tp);
        auto const swapped = [&](std::string const& name) -> std::optional<sw::tensor_source> {
          std::string other = name;
          if (auto const q = other.find("q_proj"); q != std::string::npos)
            other.replace(q, 6, "k_proj");
          else if (auto const k = other.find("k_proj"); k != std::string::npos)
            other.replace(k, 6, "q_proj");
          return gpt2_mapping(other);
        };
        (void)sw::load_pretrained(model, tp, dir / "gpt2", swapped);
        return model;
      },
      true);

  // Who reads: by default every rank opens the files and reads its own shard (the boxes of its slices); with
  // only_rank0_reads, rank 0 alone.
  for (bool rank0 : {false, true}) {
    std::string const name = rank0 ? "GPT-2 at TP 4, only_rank0_reads: tp rank 0 alone reads"
                                   : "GPT-2 at TP 4: each tp rank reads its own shard, once";
    results.run(name, [&] {
      for (auto& n : reads_begun) n = 0;
      sw::detail::checkpoint_load_hook = count_reads;
      sw::run_threads(4, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
        GPT2<false> model(gpt2_config());
        sw::parallelize(model, tp);
        (void)sw::load_pretrained(model, tp, dir / "gpt2_sharded", gpt2_mapping, {.only_rank0_reads = rank0});
      });
      sw::detail::checkpoint_load_hook = nullptr;
      std::string counts;
      bool ok = true;
      for (std::size_t r = 0; r < reads_begun.size(); ++r) {
        counts += " " + std::to_string(reads_begun[r].load());
        ok = ok && reads_begun[r] == (rank0 && r > 0 ? 0 : 1);
      }
      results.add(name, ok, "reads begun per rank:" + counts);
    });
  }

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
