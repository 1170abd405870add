#pragma once
// Training the Llama model cut into pipeline stages (models::LlamaStage over a "pp" axis, with "dp" and "tp"
// beside it): the loss curve and every parameter after the run must equal the unsharded run with the same
// microbatches (gradient accumulation on one rank), to the Llama tests' tolerances (llama_cases::check_same_run).
// Used by test_llama_pipeline (threads) and test_mpi_llama_pipeline (MPI).
#include <doctest/doctest.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/nn.hpp>
#include <span>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "llama_cases.hpp"

namespace llama_pipeline_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using llama_cases::Run;

/// Training steps of a pipeline case: 16, or SHARDWISE_TEST_STEPS. A schedule runs the unsharded step's math in
/// another order, so each step's loss and norm show whether the order is right; how far float sums in another order
/// drift over 50 steps the layouts within a stage show (test_llama, test_fsdp). At 50 steps this group took 560 s
/// of the ASan stage's test time, and its thread file ran into CTest's 300 s timeout on a loaded machine.
inline int steps() { return llama_cases::steps(16); }

/// Four blocks, so that four stages hold one each (or `layers`: 8 for ZBV at pp 4); sequences of 8 tokens (or
/// `sequence`: 9 for a cut over cp 2 that is uneven).
inline models::LlamaConfig config(bool tied = false, std::size_t layers = 4, std::size_t sequence = 8,
                                  bool qwen2 = false) {
  auto c = llama_cases::small_config();
  c.layers = layers;
  c.sequence = sequence;
  c.tie_word_embeddings = tied;
  if (qwen2) {  // Qwen2's biases on q, k and v, and a yarn rotary scaling
    c.attention_bias = true;
    c.rope_scaling = {.type = models::rope_type::yarn, .factor = 4, .original_max_positions = 64};
  }
  return c;
}

/// The mesh and the step: dp x pp x tp ranks (tp: what is left of the world), microbatches per step and rank,
/// model chunks per pp rank (2 for Interleaved1F1B<2>).
struct Setup {
  int dp = 1, pp = 1, microbatches = 1, chunks = 1;
  std::size_t layers = 4;    ///< blocks of the model: a multiple of pp * chunks
  std::size_t sequence = 8;  ///< tokens per sequence
  /// The parameters' tolerance (llama_cases::check_same_run's): 8 blocks drift further from the unsharded run
  double tolerance = llama_cases::parameter_tolerance;
  sw::stage_activations activations = sw::stage_activations::keep;
  bool checkpoint_blocks = false;  ///< activation checkpointing per transformer block
  bool tied = false;               ///< tie_word_embeddings: the embedding on the first stage, the output on the last
  bool qwen2 = false;              ///< Qwen2's biases on q, k and v and a yarn rotary scaling (config())
  bool zero1 = false;
  /// train_sharded: when the stages' gradients are reduce-scattered over dp
  sw::sharded_gradient_reduction reduction = sw::sharded_gradient_reduction::every_microbatch;
  int first_step = 0;  ///< the step whose batch comes first (a run resumed from a checkpoint)
  int sequences() const { return 2 * dp * microbatches; }  ///< per step, over every dp rank: two per microbatch
};

/// This rank's stage's parameters, gathered over tp to their unsharded shapes, in the model's order; a copy of
/// another stage's weight (the output tied to the embedding) under its owner's name, counted in `mirrors`.
template <class Stage>
std::vector<llama_cases::TrainedTensor> parameters_of(Stage& stage, int* mirrors = nullptr) {
  std::vector<llama_cases::TrainedTensor> all;
  sw::for_each_parameter(stage, [&](std::string const& name, auto const& p) {
    auto const whole = sw::full_tensor(p);
    if (mirrors && !p.mirror_of.empty()) ++*mirrors;
    auto& kept =
        all.emplace_back(llama_cases::TrainedTensor{p.mirror_of.empty() ? name : std::string(p.mirror_of), {}});
    for (Eigen::Index i = 0; i < whole.rows(); ++i)
      for (Eigen::Index j = 0; j < whole.cols(); ++j) kept.values.push_back(whole(i, j));
  });
  return all;
}

/// Trains for `steps` on a dp x pp x tp mesh of `world` with `schedule`; returns the loss curve (the same on
/// every rank) and this rank's stage's parameters. `after(stage, tp, pp)` or `after(stage, tp, pp, dp, optimizer)`
/// runs on the trained stage (a save); `before(stage, tp, pp, dp, optimizer)` on the parallelized one (a load).
struct nothing_after {
  template <class... Args>
  void operator()(Args&&...) const {}
};
/// This rank's chunks of the model: chunk k is stage k * pp + rank (one chunk unless interleaved), or as
/// `placement` puts it (ZBV's V).
template <class Plan, class PipelineMesh>
sw::stage_chunks<models::LlamaStage<float, Plan>> make_stages(
    Setup const& s, PipelineMesh const& pp, sw::stage_placement placement = sw::stage_placement::loop) {
  auto const c = config(s.tied, s.layers, s.sequence, s.qwen2);
  sw::stage_chunks<models::LlamaStage<float, Plan>> stage;
  sw::stage_split const split(c.layers, pp.size() * s.chunks);
  sw::pipeline_shape const shape{pp.size(), s.chunks, s.microbatches, placement};
  for (int k = 0; k < s.chunks; ++k) {
    stage.emplace_back(c, split, shape.stage_of(pp.rank(), k));
    stage.back().checkpoint_blocks(s.checkpoint_blocks);
  }
  return stage;
}

/// Each step's microbatches on this dp rank, and what run_pipeline_step takes of them: the first stage's input and
/// the last stage's loss gradient, which records the step's loss (the mean over the microbatches, in their order).
template <class Stages, class TensorMesh>
struct microbatch_feed {
  Stages& stage;
  TensorMesh const& tp;
  Setup const& s;
  int dp_rank;
  std::vector<std::vector<std::int64_t>> ids = std::vector<std::vector<std::int64_t>>(std::size_t(s.microbatches));
  std::vector<std::vector<std::int64_t>> targets = ids;
  float step_loss = 0;

  void load(int step) {
    int const per_rank = s.sequences() / s.dp, per_micro = per_rank / s.microbatches;
    for (std::size_t m = 0; m < ids.size(); ++m)
      llama_cases::batch(config(s.tied, s.layers, s.sequence, s.qwen2), step, s.sequences(),
                         dp_rank * per_rank + static_cast<int>(m) * per_micro, per_micro, ids[m], targets[m]);
    step_loss = 0;
  }
  auto input() {
    return [this](int m) { return std::span<const std::int64_t>(ids[static_cast<std::size_t>(m)]); };
  }
  auto loss_gradient() {
    return [this](int m, auto const& h) {
      float const scale = 1.0f / float(s.microbatches);
      auto result = stage.back().head_loss(tp, h, targets[static_cast<std::size_t>(m)], scale);
      step_loss += result.loss / float(s.microbatches);
      return result.gradient;
    };
  }
  /// The step's loss, the same on every rank: the last stage's, averaged over dp.
  template <class PipelineMesh, class DataMesh>
  float loss(PipelineMesh const& pp, DataMesh const& dp) const {
    float const loss = sw::all_reduce(pp, stage.back().is_last() ? step_loss : 0.0f, sw::Sum{});
    return sw::all_reduce(dp, loss, sw::Avg{});
  }
};

template <class Plan, class Schedule, class World, class After = nothing_after, class Before = nothing_after>
Run train(World const& world, Setup const& s, Schedule const& schedule, int steps, After&& after = {},
          Before&& before = {}) {
  auto const mesh = sw::make_mesh<"dp", "pp", "tp">(world, {s.dp, s.pp, world.size() / (s.dp * s.pp)});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const pp = sw::submesh<"pp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  auto stage = make_stages<Plan>(s, pp, sw::placement_of<Schedule>());
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f, .zero1 = s.zero1});
  sw::parallelize(stage, tp);
  before(stage, tp, pp, dp, optimizer);
  microbatch_feed<decltype(stage), decltype(tp)> feed{stage, tp, s, dp.rank()};
  Run run;
  for (int step = s.first_step; step < s.first_step + steps; ++step) {
    feed.load(step);
    sw::run_pipeline_step(schedule, pp, std::span(stage), s.microbatches, feed.input(), feed.loss_gradient(),
                          sw::pipeline_options{s.activations});
    run.norms.push_back(optimizer.step(sw::finish_gradients(stage), dp, pp));
    sw::zero_grad(stage);
    run.losses.push_back(feed.loss(pp, dp));
  }
  run.parameters = parameters_of(stage, &run.mirrors);
  if constexpr (std::is_invocable_v<After&, decltype(stage)&, decltype(tp) const&, decltype(pp) const&>)
    after(stage, tp, pp);
  else
    after(stage, tp, pp, dp, optimizer);
  return run;
}

/// train's run with the stages under FSDP (sw::fully_shard<Policy> over dp, after parallelize over tp): the
/// sharded model is what run_pipeline_step drives and AdamW::step(sharded, pp) steps.
template <class Plan, class Policy, class Schedule, class World>
Run train_sharded(World const& world, Setup const& s, Schedule const& schedule, int steps) {
  auto const mesh = sw::make_mesh<"dp", "pp", "tp">(world, {s.dp, s.pp, world.size() / (s.dp * s.pp)});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const pp = sw::submesh<"pp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  auto stage = make_stages<Plan>(s, pp, sw::placement_of<Schedule>());
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  sw::parallelize(stage, tp);
  auto sharded = sw::fully_shard<Policy>(stage, dp);
  microbatch_feed<decltype(stage), decltype(tp)> feed{stage, tp, s, dp.rank()};
  Run run;
  for (int step = s.first_step; step < s.first_step + steps; ++step) {
    feed.load(step);
    sw::run_pipeline_step(schedule, pp, sharded, s.microbatches, feed.input(), feed.loss_gradient(),
                          sw::pipeline_options{s.activations, s.reduction});
    run.norms.push_back(optimizer.step(sharded, pp));
    sw::zero_grad(sharded);
    run.losses.push_back(feed.loss(pp, dp));
  }
  sharded.unshard();
  run.parameters = parameters_of(stage, &run.mirrors);
  return run;
}

/// The unsharded run with the same sequences in the same microbatches, once per setup's batch shape (a
/// returned reference stays valid: the map only grows).
inline Run const& unsharded(Setup const& s, int steps) {
  // by (sequences, microbatches, tied, layers, sequence length, Qwen2)
  static std::map<std::tuple<int, int, bool, std::size_t, std::size_t, bool>, Run> runs;
  static std::mutex guard;  // every thread-mesh rank asks: one computes it
  std::lock_guard lock(guard);
  std::tuple<int, int, bool, std::size_t, std::size_t, bool> const key{s.sequences(), s.microbatches, s.tied,
                                                                       s.layers,      s.sequence,     s.qwen2};
  auto found = runs.find(key);
  if (found == runs.end())
    found = runs.emplace(key, llama_cases::train<sw::serial_plan>(sw::serial_world(), 1, steps, false,
                                                                  config(s.tied, s.layers, s.sequence, s.qwen2),
                                                                  s.microbatches, 1.0f, s.sequences()))
                .first;
  return found->second;
}

/// The pipeline run against the unsharded one: the same loss curve and norms, and each stage's parameters
/// equal to the unsharded model's of the same names; every parameter is on some stage.
template <class PipelineMesh>
void check_against_unsharded(PipelineMesh const& pp_of_world, Run const& got, Run const& expected,
                             double tolerance = llama_cases::parameter_tolerance) {
  REQUIRE(got.norms.size() == expected.norms.size());
  for (std::size_t i = 0; i < got.norms.size(); ++i)
    CHECK(std::abs(got.norms[i] - expected.norms[i]) <= 1e-5 * expected.norms[i]);
  Run expected_here = expected;
  expected_here.parameters.clear();
  for (auto const& mine : got.parameters)
    for (auto const& whole : expected.parameters)
      if (whole.path == mine.path) expected_here.parameters.push_back(whole);
  llama_cases::check_same_run(got, expected_here, tolerance);
  // The stages hold every parameter once: the counts over the pipeline axis add up to the model's.
  int const held = sw::all_reduce(pp_of_world, static_cast<int>(got.parameters.size()) - got.mirrors, sw::Sum{});
  CHECK(held == static_cast<int>(expected.parameters.size()));
}

/// Trains `s` with `schedule` and checks it against the unsharded run.
template <class Plan, class Schedule, class World>
void check(World const& world, Setup const& s, Schedule const& schedule, int steps) {
  INFO("dp " << s.dp << " x pp " << s.pp << " x tp " << world.size() / (s.dp * s.pp) << ", " << s.microbatches
             << " microbatches");
  Run const got = train<Plan>(world, s, schedule, steps);
  auto const mesh = sw::make_mesh<"dp", "pp", "tp">(world, {s.dp, s.pp, world.size() / (s.dp * s.pp)});
  check_against_unsharded(sw::submesh<"pp">(mesh), got, unsharded(s, steps), s.tolerance);
}

/// FSDP within the stages (full shard, a unit per block) trained with `schedule` against the unsharded run.
template <class Plan, class Schedule, class World>
void check_sharded(World const& world, Setup const& s, Schedule const& schedule, int steps) {
  bool const every = s.reduction == sw::sharded_gradient_reduction::every_microbatch;
  INFO("FSDP: dp " << s.dp << " x pp " << s.pp << " x tp " << world.size() / (s.dp * s.pp) << ", " << s.microbatches
                   << " microbatches, " << s.chunks << " chunks, reduced "
                   << std::string(every ? "every microbatch" : "at the step's end"));
  using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
  Run const got = train_sharded<Plan, policy>(world, s, schedule, steps);
  auto const mesh = sw::make_mesh<"dp", "pp", "tp">(world, {s.dp, s.pp, world.size() / (s.dp * s.pp)});
  check_against_unsharded(sw::submesh<"pp">(mesh), got, unsharded(s, steps));
}

/// FSDP within pipeline stages, every setup that fits `world`, each reducing every microbatch and once at the step's
/// end: pp 2 x dp 2 with GPipe, 1F1B, interleaved 1F1B and tied embeddings; pp 2 x dp 2 x tp 2 with sequence
/// parallelism (GPipe with tied embeddings, 1F1B).
template <class World>
void check_all_sharded(World const& world, int steps) {
  int const n = world.size();
  for (auto reduction :
       {sw::sharded_gradient_reduction::end_of_step, sw::sharded_gradient_reduction::every_microbatch}) {
    if (n == 4) {
      check_sharded<sw::serial_plan>(world, {.dp = 2, .pp = 2, .microbatches = 2, .reduction = reduction}, sw::GPipe{},
                                     steps);
      check_sharded<sw::serial_plan>(world, {.dp = 2, .pp = 2, .microbatches = 3, .reduction = reduction},
                                     sw::OneFOneB{}, steps);
      check_sharded<sw::serial_plan>(world, {.dp = 2, .pp = 2, .microbatches = 2, .chunks = 2, .reduction = reduction},
                                     sw::Interleaved1F1B<2>{}, steps);
    }
    if (n == 4)  // tied embeddings: the stages exchange the whole gradients of the root unit's tables
      check_sharded<sw::serial_plan>(world, {.dp = 2, .pp = 2, .microbatches = 3, .tied = true, .reduction = reduction},
                                     sw::OneFOneB{}, steps);
    if (n == 8) {
      check_sharded<models::llama_plan<true>>(
          world, {.dp = 2, .pp = 2, .microbatches = 2, .tied = true, .reduction = reduction}, sw::GPipe{}, steps);
      check_sharded<models::llama_plan<true>>(world, {.dp = 2, .pp = 2, .microbatches = 3, .reduction = reduction},
                                              sw::OneFOneB{}, steps);
    }
  }
}

/// Activation checkpointing per stage, and per transformer block: the same run, bit for bit.
template <class Plan, class World>
void check_recompute_bitwise(World const& world, Setup s, int steps) {
  Run const kept = train<Plan>(world, s, sw::OneFOneB{}, steps);
  for (bool per_block : {false, true}) {
    INFO((per_block ? "per block" : "per stage"));
    Setup checkpointed = s;
    if (per_block)
      checkpointed.checkpoint_blocks = true;
    else
      checkpointed.activations = sw::stage_activations::recompute;
    Run const recomputed = train<Plan>(world, checkpointed, sw::OneFOneB{}, steps);
    CHECK(recomputed.losses == kept.losses);
    REQUIRE(recomputed.parameters.size() == kept.parameters.size());
    for (std::size_t t = 0; t < kept.parameters.size(); ++t)
      CHECK(recomputed.parameters[t].values == kept.parameters[t].values);
  }
}

/// Every setup that fits `world`: pp over all ranks with GPipe and 1F1B at microbatches fewer than, equal to
/// and more than the stages, and ZB-H1 (tied too, and under tp 2 with SP); ZBV and DualPipeV (two chunks a rank in
/// the V); interleaved 1F1B at pp 2, v 2; pp 2 x tp 2
/// with sequence parallelism; dp 2 x pp 2 with ZeRO-1; dp 2 x pp 2 x tp 2.
template <class World>
void check_all(World const& world, int steps) {
  int const n = world.size();
  if (n <= 4) {
    for (int m : {1, 2, 3, 8}) {
      check<sw::serial_plan>(world, {.pp = n, .microbatches = m}, sw::GPipe{}, steps);
      check<sw::serial_plan>(world, {.pp = n, .microbatches = m}, sw::OneFOneB{}, steps);
    }
    // ZBV and DualPipeV: two chunks per rank in the V, 2 n blocks of one. At 8 blocks (pp 4, m 5) one parameter
    // drifts from the unsharded run's further than 4 blocks do: 4.31e-4 after 50 steps (g++; 1F1B on the same 8
    // blocks gave that very element and value), 5.05e-4 after 5 (clang 19 with ASan), measured 2026-11-30. 8
    // blocks: 1e-3.
    auto const v_shaped = [&](auto schedule, int m) {
      check<sw::serial_plan>(world,
                             {.pp = n,
                              .microbatches = m,
                              .chunks = 2,
                              .layers = std::size_t(2 * n),
                              .tolerance = n == 4 ? 1e-3 : llama_cases::parameter_tolerance},
                             schedule, steps);
    };
    for (int m : {2, 5}) {  // Linear's weight gradients put off from B to W, fewer and more microbatches than stages
      check<sw::serial_plan>(world, {.pp = n, .microbatches = m}, sw::ZeroBubbleH1{}, steps);
      v_shaped(sw::ZeroBubbleV{}, m);
    }
    for (int m : {2 * n, 2 * n + 1}) v_shaped(sw::DualPipeV{}, m);  // DualPipeV: at least 2 n microbatches
    check_recompute_bitwise<sw::serial_plan>(world, {.pp = n, .microbatches = 3}, steps);
  }
  if (n == 2) {  // tied embeddings: the first stage's embedding and the last stage's output stay one value
    check<sw::serial_plan>(world, {.pp = 2, .microbatches = 2, .tied = true}, sw::OneFOneB{}, steps);
    check<sw::serial_plan>(world, {.pp = 2, .microbatches = 3, .tied = true}, sw::ZeroBubbleH1{}, steps);
    check<sw::serial_plan>(world, {.pp = 2, .microbatches = 3, .tied = true, .qwen2 = true}, sw::OneFOneB{}, steps);
  }
  if (n == 2)  // interleaved: two chunks of one block each per rank, microbatches a multiple of the ranks
    for (int m : {2, 4})
      check<sw::serial_plan>(world, {.pp = 2, .microbatches = m, .chunks = 2}, sw::Interleaved1F1B<2>{}, steps);
  if (n == 4) {
    check<models::llama_plan<true>>(world, {.pp = 2, .microbatches = 4}, sw::OneFOneB{}, steps);
    check<models::llama_plan<true>>(world, {.pp = 2, .microbatches = 4}, sw::ZeroBubbleH1{}, steps);  // tp 2, SP
    check<models::llama_plan<true>>(world, {.pp = 2, .microbatches = 3}, sw::GPipe{}, steps);
    check<sw::serial_plan>(world, {.dp = 2, .pp = 2, .microbatches = 2, .zero1 = true}, sw::OneFOneB{}, steps);
    check_recompute_bitwise<models::llama_plan<true>>(world, {.pp = 2, .microbatches = 3}, steps);
    check<models::llama_plan<true>>(world, {.pp = 2, .microbatches = 3, .tied = true}, sw::OneFOneB{}, steps);
    check<sw::serial_plan>(world, {.pp = 4, .microbatches = 4, .tied = true}, sw::GPipe{}, steps);
  }
  if (n == 8)
    check<models::llama_plan<true>>(world, {.dp = 2, .pp = 2, .microbatches = 2, .zero1 = true}, sw::OneFOneB{}, steps);
}

}  // namespace llama_pipeline_cases
