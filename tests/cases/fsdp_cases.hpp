#pragma once
// Training the Llama model under FSDP (sw::fully_shard): the loss curve, the global gradient norm of every step
// and the parameters after the run must equal the unsharded run's, for every strategy, wrap policy, hybrid
// sharding, FSDP over dp x TP over tp, activation checkpointing and uneven shards; a MoeLlama's experts sharded
// with the rest.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "cases/expert_parallel_cases.hpp"
#include "cases/llama_cases.hpp"

namespace fsdp_cases {

namespace sw = shardwise;
namespace models = shardwise::models;

/// Clipping engaged on every step: each step's norm here is above it.
inline constexpr float max_norm = 0.1f;

/// The optimizer of every run here (the unsharded one's too).
inline sw::AdamWOptions<float> const adamw_options{.learning_rate = 3e-3f, .max_grad_norm = max_norm};

/// How a run is sharded: dp ranks (for hybrid: shard x replicate), the rest of the world tp.
struct Setup {
  int dp = 1;
  int replicate = 1;
  int sequences = 4;  // per step, over every data-parallel rank  // hybrid: groups of `dp` ranks holding equal shards
  bool checkpoint_blocks = false;
  std::size_t min_num_params = 0;  // wrap_min_params' threshold
  bool one_mesh = false;           // sw::fully_shard on the dp x tp mesh (it parallelizes), not on dp after parallelize
  bool sync_module_states = false;    // each dp rank builds its model from another seed; rank 0's is broadcast
  int microbatches = 1;               // per step and rank, their gradients accumulated
  bool sync_last_microbatch = false;  // set_requires_gradient_sync off but for the last microbatch's backward
  bool validation_forward = false;    // a forward without backward between the last backward and the step
  bool prefetch = false;              // forward and backward prefetch (fsdp_options)
};

/// The unsharded run: one rank, no FSDP, the same batches (every dp rank's sequences in one batch).
inline llama_cases::Run serial_run(models::LlamaConfig const& c, int steps, int sequences = 4, int microbatches = 1) {
  static std::mutex guard;  // every thread-mesh rank may ask at once
  std::lock_guard lock(guard);
  return llama_cases::train<sw::serial_plan>(sw::serial_world(), 1, steps, false, c, microbatches, max_norm, sequences);
}

/// Every parameter of a model under FSDP, whole (collective over dp and tp).
template <class Sharded>
std::vector<llama_cases::TrainedTensor> whole_parameters(Sharded& sharded) {
  std::vector<llama_cases::TrainedTensor> parameters;
  sharded.unshard();
  sw::for_each_parameter(sharded.model(), [&](std::string const& name, auto const& p) {
    auto const whole = sw::full_tensor(p);
    auto& kept = parameters.emplace_back(llama_cases::TrainedTensor{name, {}});
    for (Eigen::Index i = 0; i < whole.rows(); ++i)
      for (Eigen::Index j = 0; j < whole.cols(); ++j) kept.values.push_back(whole(i, j));
  });
  sharded.reshard();
  return parameters;
}

/// Every step's loss (the whole batch's mean), norm and, at the end, every parameter gathered whole.
/// With `resumed`, that optimizer steps, from step `first_step` (the batches of those steps).
template <class Sharded, class Tp, class Everyone>
llama_cases::Run train_steps(Sharded& sharded, Tp const& tp, Everyone const& all, int data_rank, int data_ranks,
                             Setup const& setup, models::LlamaConfig const& c, int steps,
                             sw::AdamW<float>* resumed = nullptr, int first_step = 0) {
  sw::AdamW<float> own(adamw_options);
  sw::AdamW<float>& optimizer = resumed ? *resumed : own;
  int const sequences = setup.sequences, per_rank = sequences / data_ranks, micro = setup.microbatches;
  llama_cases::Run run;
  std::vector<std::int64_t> ids, targets;
  for (int step = first_step; step < first_step + steps; ++step) {
    float loss = 0;
    for (int m = 0; m < micro; ++m) {  // gradient accumulation: each microbatch's share of the mean
      llama_cases::batch(c, step, sequences, data_rank * per_rank + m * per_rank / micro, per_rank / micro, ids,
                         targets);
      auto const logits = sharded.forward(ids);
      auto result = models::llama_loss(tp, logits, targets, c.vocabulary);
      result.dlogits.local /= float(micro);
      if (setup.sync_last_microbatch) sharded.set_requires_gradient_sync(m + 1 == micro);
      sharded.backward(result.dlogits);
      loss += result.loss / float(micro);
    }
    if (setup.validation_forward) (void)sharded.forward(ids);  // no backward: must not change the training
    run.norms.push_back(optimizer.step(sharded));
    sw::zero_grad(sharded);
    run.losses.push_back(sw::all_reduce(all, loss, sw::Avg{}));  // tp ranks hold the same loss
  }
  if (setup.prefetch && sharded.unit_paths().size() > 1) {  // the option must have done something to be tested
    std::size_t const units_after_the_first = sharded.unit_paths().size() - 2;
    CHECK(sharded.prefetched_gathers() >= std::size_t(steps * micro) * (2 * units_after_the_first + 1));
  }
  run.parameters = whole_parameters(sharded);
  return run;
}

/// Trains under Policy on `world` as `setup` says (tp: world / (dp x replicate)); every rank returns the run.
template <class Policy, class Plan, class World>
llama_cases::Run train(World const& world, Setup const& setup, models::LlamaConfig const& c, int steps) {
  int const data = setup.dp * setup.replicate;
  auto const mesh = sw::make_mesh<"replicate", "dp", "tp">(world, {setup.replicate, setup.dp, world.size() / data});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  auto const all = sw::make_mesh<"all">(world, {world.size()});
  int const data_rank = mesh.template coordinate<"replicate">() * setup.dp + dp.rank();
  auto own = c;
  if (setup.sync_module_states) own.seed += static_cast<std::uint64_t>(data_rank);
  models::Llama<float, Plan> model(own);
  model.checkpoint_blocks(setup.checkpoint_blocks);
  sw::fsdp_options const options{.min_num_params = setup.min_num_params,
                                 .sync_module_states = setup.sync_module_states,
                                 .forward_prefetch = setup.prefetch,
                                 .backward_prefetch = setup.prefetch};
  if (setup.one_mesh) {  // the same ranks on each axis: the replicate axis has size 1 and comes first
    auto sharded = sw::fully_shard<Policy>(model, sw::make_mesh<"dp", "tp">(world, {setup.dp, tp.size()}), options);
    return train_steps(sharded, tp, all, data_rank, data, setup, c, steps);
  }
  sw::parallelize(model, tp);
  if constexpr (!std::is_same_v<typename Policy::strategy, sw::no_shard>) {  // hybrid shards
    if (setup.replicate > 1) {
      auto sharded = sw::fully_shard<Policy>(model, dp, sw::submesh<"replicate">(mesh), options);
      return train_steps(sharded, tp, all, data_rank, data, setup, c, steps);
    }
  }
  auto sharded = sw::fully_shard<Policy>(model, dp, options);
  return train_steps(sharded, tp, all, data_rank, data, setup, c, steps);
}

/// How close a run must be to its reference: parameters as llama_cases::check_same_run (relative to |w| + the
/// tensor's rms), norms relative.
struct Tolerance {
  double parameters = llama_cases::parameter_tolerance;
  double norms = 1e-4;
};

/// Rounding to bfloat16 where the fp32 values differ from the reference's by fp32 rounding (at dp 2: each rank's
/// gradient sums its own sequences and the two are added, where the reference sums all four at once; under TP:
/// sums in another order; a norm summed over shards in another order gives a clip factor an ulp away, and the
/// masters follow): a value that close to a bfloat16 rounding boundary rounds to the neighbouring one, 2^-8
/// relative away, so a few weights or gradients differ by one bfloat16 step for a while. Measured after 50
/// steps: bf16 gathers at dp 2 x tp 2, 318 of 19,264 elements over 2e-4, the worst 8.8e-4, norms within 1.4e-4;
/// bf16 reduce at dp 2, parameters within 2e-4, norms within 2.0e-4; bf16 gathers at dp 2 (since the blocked
/// attention moved fp32 roundings; until then no value had landed on a boundary), 378 elements over 2e-4, the
/// worst 6.9e-4, norms within 1.4e-4 from step 20.
inline constexpr Tolerance bf16_rounding{.parameters = 2e-3, .norms = 5e-4};

/// The run equals the reference: losses within 1e-4 relative, parameters and every step's global norm
/// (clipping engaged) within `tolerance`.
inline void check_same_training(llama_cases::Run const& got, llama_cases::Run const& expected,
                                Tolerance tolerance = {}) {
  llama_cases::check_same_run(got, expected, tolerance.parameters);
  REQUIRE(got.norms.size() == expected.norms.size());
  for (std::size_t i = 0; i < got.norms.size(); ++i) {
    INFO("step " << i << ": norm " << got.norms[i] << " vs " << expected.norms[i]);
    CHECK(expected.norms[i] > max_norm);  // clipped
    CHECK(std::abs(got.norms[i] - expected.norms[i]) <= tolerance.norms * expected.norms[i]);
  }
}

/// The unsharded run that rounds as mixed_precision<Eigen::bfloat16, Reduce> does: before each forward every
/// parameter is rounded to bfloat16 (the fp32 masters kept aside and restored for the optimizer). With
/// reduce_in_bf16, the gradient is computed per dp rank (each on its own sequences, as that rank does),
/// rounded to bfloat16 and averaged as every backend reduces bfloat16: summed in rank order, rounding after each
/// addition, then divided by the ranks; else it is the whole batch's, in fp32.
inline llama_cases::Run bf16_reference(models::LlamaConfig const& c, int steps, int data_ranks, bool reduce_in_bf16) {
  static std::mutex guard;  // every thread-mesh rank may ask at once
  std::lock_guard lock(guard);
  using bf16 = Eigen::bfloat16;
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::Llama<float> model(c);
  sw::AdamW<float> optimizer(adamw_options);
  std::vector<Eigen::MatrixXf> masters;
  auto each = [&](auto&& fn) {  // fn(index, value, grad) over the parameters
    std::size_t i = 0;
    sw::for_each_parameter(model, [&](std::string const&, auto const& p) { fn(i++, *p.value, *p.grad); });
  };
  llama_cases::Run run;
  std::vector<std::int64_t> ids, targets;
  int const sequences = 4, ranks = reduce_in_bf16 ? data_ranks : 1, per = sequences / ranks;
  for (int step = 0; step < steps; ++step) {
    masters.clear();
    each([&](std::size_t, auto& value, auto&) {
      masters.emplace_back(value);
      value = value.template cast<bf16>().template cast<float>();
    });
    std::vector<Eigen::Matrix<bf16, Eigen::Dynamic, Eigen::Dynamic>> sum;
    double loss = 0;
    for (int r = 0; r < ranks; ++r) {
      llama_cases::batch(c, step, sequences, r * per, per, ids, targets);
      auto const result = models::llama_loss(tp, model.forward(ids), targets, c.vocabulary);
      model.backward(result.dlogits);
      loss += result.loss / ranks;
      each([&](std::size_t i, auto&, auto& grad) {
        if (!reduce_in_bf16) return;
        Eigen::Matrix<bf16, Eigen::Dynamic, Eigen::Dynamic> const g = grad.template cast<bf16>();
        if (r == 0)
          sum.push_back(g);
        else
          sum[i] = (sum[i] + g).eval();  // bfloat16 + bfloat16 rounds each sum
        grad.setZero();
      });
    }
    each([&](std::size_t i, auto& value, auto& grad) {
      value = masters[i];
      if (reduce_in_bf16) grad = (sum[i] / bf16(float(ranks))).template cast<float>();
    });
    run.norms.push_back(optimizer.step(sw::finish_gradients(model), dp));
    sw::zero_grad(model);
    run.losses.push_back(loss);
  }
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    auto& kept = run.parameters.emplace_back(llama_cases::TrainedTensor{name, {}});
    for (Eigen::Index i = 0; i < p.value->rows(); ++i)
      for (Eigen::Index j = 0; j < p.value->cols(); ++j) kept.values.push_back((*p.value)(i, j));
  });
  return run;
}

/// A configuration whose sizes dp 3 and 4 do not divide (rows 67, 70, 20 and 40 over 3; 67 and 70 over 4);
/// trained on 12 sequences a step, which they do.
inline models::LlamaConfig uneven_config() {
  models::LlamaConfig c;
  c.vocabulary = 67, c.dim = 40, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 70, c.sequence = 8;
  return c;
}

using blocks = sw::wrap_paths<"layers.*">;
using tp_only = models::llama_plan<false>;
using sequence_parallel = models::llama_plan<true>;

/// The MoeLlama of the cases below: 2 blocks of 8 experts, top-2, a gated shared expert.
inline models::LlamaConfig moe_config() {
  return expert_parallel_cases::model_config(expert_parallel_cases::config(), 9);
}

/// 3 AdamW steps of `sharded` over `ranks` dp ranks, each rank (`me`) its own rows, against the unsharded `whole`
/// trained on every rank's rows with their gradients averaged: each rank's loss (its cross-entropy and its own
/// load-balancing loss, as DDP computes them) and the clipped norm (fp64, 1e-12).
template <class Sharded>
void check_moe_steps(Sharded& sharded, models::MoeLlama<double>& whole, int ranks, int me, std::string const& what) {
  double const coef = moe_config().moe->router_aux_loss_coef;
  auto const ids = [](int step, int q, bool targets) {
    std::vector<std::int64_t> v;
    for (int i = 0; i < 4 * (q + 1); ++i) v.push_back((step * 5 + q * 7 + i * 3 + (targets ? 1 : 0)) % 20);
    return v;
  };
  auto const alone = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const serial = sw::make_mesh<"dp">(sw::serial_world(), {1});
  sw::AdamWOptions<double> const options{.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 0.5};
  sw::AdamW<double> step_sharded(options), step_whole(options);
  for (int step = 0; step < 3; ++step) {
    auto const result = models::llama_loss(alone, sharded.forward(ids(step, me, false)), ids(step, me, true), 20);
    sharded.backward(result.dlogits);
    double const loss = result.loss + coef * sharded.model().router_aux_loss();
    double const norm = step_sharded.step(sharded);
    sw::zero_grad(sharded);
    double mine = 0;
    for (int q = 0; q < ranks; ++q) {
      auto const r = models::llama_loss(alone, whole.forward(ids(step, q, false)), ids(step, q, true), 20);
      whole.backward(r.dlogits);
      if (q == me) mine = r.loss + coef * whole.router_aux_loss();
    }
    sw::for_each_parameter(whole, [&](std::string const&, auto const& p) { *p.grad /= double(ranks); });
    double const whole_norm = step_whole.step(sw::finish_gradients(whole), serial);
    sw::zero_grad(whole);
    INFO(what << ", step " << step);
    CHECK(loss == doctest::Approx(mine).epsilon(1e-12));
    CHECK(norm == doctest::Approx(whole_norm).epsilon(1e-12));
  }
}

/// The MoeLlama under full shard over every rank, each block a unit (its experts sharded with the rest), against
/// the unsharded run (check_moe_steps).
template <class World>
void check_moe_llama(World const& world) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {world.size(), 1});
  models::MoeLlama<double> model(moe_config()), whole(moe_config());
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, mesh);
  check_moe_steps(sharded, whole, world.size(), sw::submesh<"dp">(mesh).rank(),
                  "MoeLlama under FSDP, dp " + std::to_string(world.size()));
}

/// The MoeLlama with its experts placed over ep ranks drawn from dp (EP within dp, as torchtitan draws it): dp = edp
/// x ep, the experts over "ep" and each expert fully sharded over its replicas ("edp"), every other parameter over
/// all of dp, against the unsharded run (check_moe_steps); the trained experts (gathered by unshard) equal the
/// unsharded ones. A placement without the replicas, and a checkpoint, are refused by name.
template <class World>
void check_moe_llama_placed(World const& world, int ep_size) {
  int const ranks = world.size();
  models::LlamaConfig const c = moe_config();
  auto const layout = sw::make_mesh<"edp", "ep">(world, {ranks / ep_size, ep_size});
  auto const ep = sw::submesh<"ep">(layout);
  auto const dp = sw::make_mesh<"dp">(world, {ranks});
  models::MoeLlama<double> model(c), whole(c);
  (void)sw::expert_parallelize(model, ep, sw::submesh<"edp">(layout));
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, dp);
  check_moe_steps(
      sharded, whole, ranks, dp.rank(),
      "MoeLlama with its experts over ep " + std::to_string(ep_size) + " under FSDP over dp " + std::to_string(ranks));
  sharded.unshard();
  auto const& experts = model.layers[1].feed_forward.experts;
  CHECK(experts.size() == 8 / std::size_t(ep_size));
  for (std::size_t l = 0; l < experts.size(); ++l) {
    auto const& reference = whole.layers[1].feed_forward.experts[experts.first + l];
    CHECK((experts[l].w1.weight - reference.w1.weight).cwiseAbs().maxCoeff() < 1e-12);
    CHECK((experts[l].w2.weight - reference.w2.weight).cwiseAbs().maxCoeff() < 1e-12);
  }
  CHECK((model.layers[0].feed_forward.gate.weight - whole.layers[0].feed_forward.gate.weight).cwiseAbs().maxCoeff() <
        1e-12);
  sharded.reshard();
  CHECK_THROWS_WITH_AS(sw::save_sharded(sharded, "unused", 0),
                       "shardwise: the model's experts are placed over ep ranks (sw::expert_parallelize), whose "
                       "checkpoints under sw::fully_shard are not built yet; do it before placing its experts",
                       sw::error);
  if (ep_size == ranks) return;
  models::MoeLlama<double> alone_placed(c);  // placed over ep without the replicas: the ep ranks are not dp's
  (void)sw::expert_parallelize(alone_placed, ep);
  auto const shard = [&] { return sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(alone_placed, dp); };
  CHECK_THROWS_WITH_AS((void)shard(),
                       doctest::Contains("each expert is cut over the ranks that hold it: place the experts over an "
                                         "\"ep\" axis with their replicas over \"edp\""),
                       sw::error);
}

}  // namespace fsdp_cases
