#pragma once
// Training the GPT-2 model sharded: the loss curve and the parameters after the run must equal the unsharded
// run's (llama_cases' Run and check_same_run), with AdamW parameter groups (no weight decay for biases and
// LayerNorm weights) and global-norm clipping engaged on every step.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "cases/llama_context_cases.hpp"

namespace gpt2_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using llama_cases::Run;

inline models::GPT2Config small_config() {
  models::GPT2Config c;
  c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.sequence = 8;
  return c;
}

/// Clipping threshold: below every step's global norm in these runs (measured 1.21 to 2.51 over the 50 steps of
/// small_config), so every step is clipped, and a norm that counted a gradient twice or missed one would change
/// the curve (clipped and unclipped curves measured 6.3e-3 relative apart at 50 steps).
inline constexpr float max_grad_norm = 0.5f;

/// The AdamW options of every run here: weight decay 0.1 except for biases and LayerNorm weights, GPT-2's
/// recipe (nanoGPT, Megatron). Learning rate 1e-3: at 3e-3 a wte element whose gradient cancels near AdamW's eps
/// drifted by 3.5e-4 (|expected| + rms) between sharded and unsharded runs, over check_same_run's 2e-4 (see
/// llama_cases::parameter_tolerance); at 1e-3 the worst is 7.4e-5.
inline sw::AdamWOptions<float> adamw(bool zero1, float max_norm = max_grad_norm) {
  return {.learning_rate = 1e-3f,
          .weight_decay = 0.1f,
          .max_grad_norm = max_norm,
          .zero1 = zero1,
          .groups = {{.matches = sw::names_matching({"*.bias", "*ln_*.weight"}), .weight_decay = 0.0f}}};
}

/// Batches of `sequences` sequences of a deterministic pseudo-text; each dp rank takes `count` from `first`.
inline void batch(models::GPT2Config const& c, int step, int sequences, int first, int count,
                  std::vector<std::int64_t>& ids, std::vector<std::int64_t>& targets) {
  ids.clear(), targets.clear();
  for (int b = first; b < first + count; ++b)
    for (std::size_t t = 0; t < c.sequence; ++t) {
      auto const base = static_cast<std::uint64_t>(step * sequences + b) * 7919u + t * 104729u;
      ids.push_back(static_cast<std::int64_t>((base * 2654435761u >> 7) % c.vocabulary));
      targets.push_back(static_cast<std::int64_t>(((base + 104729u) * 2654435761u >> 7) % c.vocabulary));
    }
}

/// The sequences cut over cp ranks (sw::context_parallelize): 1 for none.
struct context_cut {
  int cp = 1;
  sw::context_method method = sw::context_method::ring;
};

/// Trains for `steps` on a dp x cp x tp mesh of `world` (cp 1 but for `cut`); every rank returns the same Run (but
/// for state_elements and dp_rank). Under cp each rank's loss is weighted by its share of the tokens and the
/// gradients are averaged over dp x cp. Unsharded runs (one rank) also record the norm of the gradients as computed
/// here (own_norms).
template <class Plan, class World>
Run train(World const& world, int dp_size, int steps, bool zero1, models::GPT2Config const& c,
          float max_norm = max_grad_norm, context_cut cut = {}) {
  int const tp_size = world.size() / (dp_size * cut.cp);
  auto const mesh = sw::make_mesh<"dp", "cp", "tp">(world, {dp_size, cut.cp, tp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(world, {dp_size * cut.cp, tp_size}));
  models::GPT2<float, Plan> model(c);
  sw::AdamW<float> optimizer(adamw(zero1, max_norm));
  sw::parallelize(model, tp);
  std::shared_ptr<sw::context_parallel const> context;
  if (cut.cp > 1) context = sw::context_parallelize(model, sw::submesh<"cp">(mesh), {c.sequence, cut.cp}, cut.method);
  float const weight = context ? static_cast<float>(context->mean_weight()) : 1.0f;
  auto const here = [&](std::vector<std::int64_t> const& all) { return context ? context->my_tokens(all) : all; };
  constexpr int sequences = 4;
  int const per_rank = sequences / dp_size;
  Run run;
  run.dp_rank = dp.rank();
  std::vector<std::int64_t> ids, targets;
  for (int step = 0; step < steps; ++step) {
    batch(c, step, sequences, dp.rank() * per_rank, per_rank, ids, targets);
    auto const logits = model.forward(here(ids));
    auto result = models::gpt2_loss(tp, logits, here(targets), c.vocabulary);
    result.dlogits.local *= weight;
    model.backward(result.dlogits);
    auto finished = sw::finish_gradients(model);
    if (world.size() == 1) {
      double squares = 0;
      sw::for_each_parameter(finished,
                             [&](std::string const&, auto const& p) { squares += double(p.grad->squaredNorm()); });
      run.own_norms.push_back(std::sqrt(squares));
    }
    run.norms.push_back(optimizer.step(finished, data));
    sw::zero_grad(model);
    run.losses.push_back(sw::all_reduce(data, result.loss * weight, sw::Avg{}));  // the whole batch's
  }
  run.state_elements = optimizer.state_elements();
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    auto const whole = sw::full_tensor(p);  // vocabulary and position padding left out
    auto& kept = run.parameters.emplace_back(llama_cases::TrainedTensor{name, {}});
    for (Eigen::Index i = 0; i < whole.rows(); ++i)
      for (Eigen::Index j = 0; j < whole.cols(); ++j) kept.values.push_back(whole(i, j));
  });
  return run;
}

/// The run's global norms against the unsharded run's (1e-5 relative: fp32 sums in another order; measured at
/// most 6.6e-6 over 50 steps, 2e-7 over the first 18), and every step clipped.
inline void check_same_norms(Run const& got, Run const& expected, float max_norm = max_grad_norm) {
  REQUIRE(got.norms.size() == expected.norms.size());
  for (std::size_t i = 0; i < got.norms.size(); ++i) {
    INFO("step " << i << ": norm " << got.norms[i] << " vs unsharded " << expected.norms[i]);
    CHECK(std::abs(got.norms[i] - expected.norms[i]) <= 1e-5 * expected.norms[i]);
    CHECK(got.norms[i] > max_norm);
  }
}

/// The run without the key biases. Their gradient is zero in exact arithmetic (a key bias adds q . b to every
/// score of a query's row, which the softmax does not see), so each element's gradient is fp32 rounding, ~1e-10,
/// and AdamW turns it into a step of up to 1% of the learning rate in a direction the rounding picks: sharded
/// and unsharded runs move them differently (measured: up to 1.4e-4 apart after 50 steps, 8.5e-4 of
/// (|expected| + rms)), with no effect on anything else. The losses, the norms and every other parameter are compared
/// in full.
inline Run without_key_biases(Run run) {
  std::erase_if(run.parameters,
                [](llama_cases::TrainedTensor const& t) { return t.path.ends_with("attn.k_proj.bias"); });
  return run;
}

/// Loss curve and final parameters (llama_cases::check_same_run, key biases left out) and the norms.
inline void check_same_training(Run const& got, Run const& expected) {
  check_same_norms(got, expected);
  llama_cases::check_same_run(without_key_biases(got), without_key_biases(expected));
}

}  // namespace gpt2_cases
