#pragma once
// Training the Llama model under FSDP (sw::fully_shard): the loss curve, the global gradient norm of every step
// and the parameters after the run must equal the unsharded run's, for every strategy, wrap policy, hybrid
// sharding, FSDP over dp x TP over tp, activation checkpointing and uneven shards.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <mutex>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "cases/llama_cases.hpp"

namespace fsdp_cases {

namespace sw = shardwise;
namespace models = shardwise::models;

/// Clipping engaged on every step: each step's norm here is above it.
inline constexpr float max_norm = 0.1f;

/// How a run is sharded: dp ranks (for hybrid: shard x replicate), the rest of the world tp.
struct Setup {
  int dp = 1;
  int replicate = 1;
  int sequences = 4;  // per step, over every data-parallel rank  // hybrid: groups of `dp` ranks holding equal shards
  bool checkpoint_blocks = false;
  std::size_t min_num_params = 0;  // wrap_min_params' threshold
  bool one_mesh = false;  // sw::fully_shard on the dp x tp mesh (it parallelizes), not on dp after parallelize
};

/// The unsharded run: one rank, no FSDP, the same batches (every dp rank's sequences in one batch).
inline llama_cases::Run serial_run(models::LlamaConfig const& c, int steps, int sequences = 4) {
  static std::mutex guard;  // every thread-mesh rank may ask at once
  std::lock_guard lock(guard);
  return llama_cases::train<sw::serial_plan>(sw::serial_world(), 1, steps, false, c, 1, max_norm, sequences);
}

/// Every step's loss (the whole batch's mean), norm and, at the end, every parameter gathered whole.
template <class Sharded, class Tp, class Everyone>
llama_cases::Run train_steps(Sharded& sharded, Tp const& tp, Everyone const& all, int data_rank, int data_ranks,
                             int sequences, models::LlamaConfig const& c, int steps) {
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = max_norm});
  int const per_rank = sequences / data_ranks;
  llama_cases::Run run;
  std::vector<std::int64_t> ids, targets;
  for (int step = 0; step < steps; ++step) {
    llama_cases::batch(c, step, sequences, data_rank * per_rank, per_rank, ids, targets);
    auto const logits = sharded.forward(ids);
    auto result = models::llama_loss(tp, logits, targets, c.vocabulary);
    sharded.backward(result.dlogits);
    run.norms.push_back(optimizer.step(sharded));
    sw::zero_grad(sharded);
    run.losses.push_back(sw::all_reduce(all, result.loss, sw::Avg{}));  // tp ranks hold the same loss
  }
  sharded.unshard();
  sw::for_each_parameter(sharded.model(), [&](std::string const& name, auto const& p) {
    auto const whole = sw::full_tensor(p);
    auto& kept = run.parameters.emplace_back(llama_cases::TrainedTensor{name, {}});
    for (Eigen::Index i = 0; i < whole.rows(); ++i)
      for (Eigen::Index j = 0; j < whole.cols(); ++j) kept.values.push_back(whole(i, j));
  });
  sharded.reshard();
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
  models::Llama<float, Plan> model(c);
  model.checkpoint_blocks(setup.checkpoint_blocks);
  int const data_rank = mesh.template coordinate<"replicate">() * setup.dp + dp.rank();
  sw::fsdp_options const options{.min_num_params = setup.min_num_params};
  if (setup.one_mesh) {  // the same ranks on each axis: the replicate axis has size 1 and comes first
    auto sharded = sw::fully_shard<Policy>(model, sw::make_mesh<"dp", "tp">(world, {setup.dp, tp.size()}), options);
    return train_steps(sharded, tp, all, data_rank, data, setup.sequences, c, steps);
  }
  sw::parallelize(model, tp);
  if constexpr (!std::is_same_v<typename Policy::strategy, sw::no_shard>) {  // hybrid shards
    if (setup.replicate > 1) {
      auto sharded = sw::fully_shard<Policy>(model, dp, sw::submesh<"replicate">(mesh), options);
      return train_steps(sharded, tp, all, data_rank, data, setup.sequences, c, steps);
    }
  }
  auto sharded = sw::fully_shard<Policy>(model, dp, options);
  return train_steps(sharded, tp, all, data_rank, data, setup.sequences, c, steps);
}

/// The run equals the unsharded one: losses and parameters as llama_cases::check_same_run, and every step's
/// global norm (clipping engaged) within 1e-4 relative.
inline void check_same_training(llama_cases::Run const& got, llama_cases::Run const& expected) {
  llama_cases::check_same_run(got, expected);
  REQUIRE(got.norms.size() == expected.norms.size());
  for (std::size_t i = 0; i < got.norms.size(); ++i) {
    INFO("step " << i << ": norm " << got.norms[i] << " vs " << expected.norms[i]);
    CHECK(expected.norms[i] > max_norm);  // clipped
    CHECK(std::abs(got.norms[i] - expected.norms[i]) <= 1e-4 * expected.norms[i]);
  }
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

}  // namespace fsdp_cases
