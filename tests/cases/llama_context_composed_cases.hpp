#pragma once
// Context parallelism composed with FSDP and with pipeline stages: the Llama model with its sequences cut over cp
// and its parameters sharded by sw::fully_shard over dp x cp (as torchtitan shards over its dp_shard x cp mesh),
// and LlamaStage pipelines whose stages each see this cp rank's tokens (1F1B, ZB-H1, and FSDP within the stages).
// Every run is checked against the unsharded run of the same batches: losses 1e-4 relative, clipped norms 1e-5
// relative, parameters within llama_context_cases::context_parameter_tolerance. Sequences of 9 tokens: cut in
// head-tail chunks over cp 2, rank 0 holds 5 of them and rank 1 holds 4, so the loss weights are not 1.
// Used by test_llama_pipeline (threads) and test_mpi_llama_pipeline (MPI), whose binary already builds these parts.
#include <doctest/doctest.h>

#include <memory>
#include <shardwise/context.hpp>
#include <string>
#include <vector>

#include "cases/fsdp_cases.hpp"
#include "cases/llama_context_cases.hpp"
#include "cases/llama_pipeline_cases.hpp"

namespace llama_context_composed_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using llama_cases::Run;

/// How a run is cut: dp x cp (x pp) ranks, tp the rest of the world; FSDP over dp x cp when `fsdp`.
struct Layout {
  int dp = 1, cp = 2, pp = 1;
  bool fsdp = false;
  int microbatches = 1;  // per step and dp rank, with pp
  sw::context_method method = sw::context_method::ring;
};

inline std::size_t const sequence = 9;
using blocks_policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;

/// The whole Llama model cut over cp and sharded by FSDP over dp x cp (one "data" axis in the same rank order);
/// tp (the rest of the world) by the plan. Four sequences a step over dp, each rank's loss weighted by its share of
/// the tokens (mean_weight) and averaged over dp x cp by the sharded gradients' reduction.
template <class Plan, class World>
Run train_fsdp(World const& world, Layout const& l, int steps, models::LlamaConfig const& c) {
  int const tp_size = world.size() / (l.dp * l.cp);
  auto const mesh = sw::make_mesh<"dp", "cp", "tp">(world, {l.dp, l.cp, tp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(world, {l.dp * l.cp, tp_size}));
  models::Llama<float, Plan> model(c);
  sw::parallelize(model, tp);
  auto const context = sw::context_parallelize(model, sw::submesh<"cp">(mesh), {c.sequence, l.cp}, l.method);
  auto sharded = sw::fully_shard<blocks_policy>(model, data);
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  int const sequences = 4, per_rank = sequences / l.dp, dp_rank = mesh.template coordinate<"dp">();
  auto const weight = static_cast<float>(context->mean_weight());
  Run run;
  std::vector<std::int64_t> ids, targets;
  for (int step = 0; step < steps; ++step) {
    llama_cases::batch(c, step, sequences, dp_rank * per_rank, per_rank, ids, targets);
    auto const logits = sharded.forward(context->my_tokens(ids));
    auto result = models::llama_loss(tp, logits, context->my_tokens(targets), c.vocabulary);
    result.dlogits.local *= weight;
    sharded.backward(result.dlogits);
    run.norms.push_back(optimizer.step(sharded));
    sw::zero_grad(sharded);
    run.losses.push_back(sw::all_reduce(data, result.loss * weight, sw::Avg{}));
  }
  run.parameters = fsdp_cases::whole_parameters(sharded);
  return run;
}

/// A pipeline step's feed under cp: each microbatch's tokens of this cp rank to the first stage, and the last
/// stage's loss on this rank's targets weighted by its share of the tokens.
template <class Stages, class TensorMesh>
struct context_feed {
  llama_pipeline_cases::microbatch_feed<Stages, TensorMesh> whole;  // the batches of whole sequences
  sw::context_parallel const& context;
  std::vector<std::vector<std::int64_t>> ids{}, targets{};
  float step_loss = 0;

  void load(int step) {
    whole.load(step);
    ids.clear(), targets.clear();
    for (std::size_t m = 0; m < whole.ids.size(); ++m) {
      ids.push_back(context.my_tokens(whole.ids[m]));
      targets.push_back(context.my_tokens(whole.targets[m]));
    }
    step_loss = 0;
  }
  auto input() {
    return [this](int m) { return std::span<const std::int64_t>(ids[static_cast<std::size_t>(m)]); };
  }
  auto loss_gradient() {
    return [this](int m, auto const& h) {
      float const share = static_cast<float>(context.mean_weight()) / float(whole.s.microbatches);
      auto result = whole.stage.back().head_loss(whole.tp, h, targets[static_cast<std::size_t>(m)], share);
      step_loss += result.loss * share;
      return result.gradient;
    };
  }
  /// The step's loss on every rank: the last stage's, averaged over dp x cp.
  template <class PipelineMesh, class DataMesh>
  float loss(PipelineMesh const& pp, DataMesh const& data) const {
    float const loss = sw::all_reduce(pp, whole.stage.back().is_last() ? step_loss : 0.0f, sw::Sum{});
    return sw::all_reduce(data, loss, sw::Avg{});
  }
};

/// LlamaStage pipelines over pp with each stage's sequences cut over cp (tp the rest of the world); with `fsdp`,
/// the stages sharded over dp x cp. Gradients averaged over dp x cp.
template <class Plan, class Schedule, class World>
Run train_pipeline(World const& world, Layout const& l, llama_pipeline_cases::Setup const& s, Schedule const& schedule,
                   int steps) {
  int const tp_size = world.size() / (l.pp * l.dp * l.cp);
  auto const mesh = sw::make_mesh<"pp", "dp", "cp", "tp">(world, {l.pp, l.dp, l.cp, tp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const pp = sw::submesh<"pp">(mesh);
  auto const data = sw::submesh<"data">(sw::make_mesh<"pp", "data", "tp">(world, {l.pp, l.dp * l.cp, tp_size}));
  auto stage = llama_pipeline_cases::make_stages<Plan>(s, pp, sw::placement_of<Schedule>());
  sw::parallelize(stage, tp);
  std::shared_ptr<sw::context_parallel const> context;
  for (auto& chunk : stage)
    context = sw::context_parallelize(chunk, sw::submesh<"cp">(mesh), {s.sequence, l.cp}, l.method);
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  context_feed<decltype(stage), decltype(tp)> feed{{stage, tp, s, mesh.template coordinate<"dp">()}, *context};
  Run run;
  auto train_with = [&](auto&& driven, auto&& step_optimizer, auto& zeroed) {
    for (int step = 0; step < steps; ++step) {
      feed.load(step);
      sw::run_pipeline_step(schedule, pp, driven, s.microbatches, feed.input(), feed.loss_gradient());
      run.norms.push_back(step_optimizer());
      sw::zero_grad(zeroed);
      run.losses.push_back(feed.loss(pp, data));
    }
  };
  if (l.fsdp) {
    auto sharded = sw::fully_shard<blocks_policy>(stage, data);
    train_with(sharded, [&] { return optimizer.step(sharded, pp); }, sharded);
    sharded.unshard();
  } else {
    train_with(std::span(stage), [&] { return optimizer.step(sw::finish_gradients(stage), data, pp); }, stage);
  }
  run.parameters = llama_pipeline_cases::parameters_of(stage, &run.mirrors);
  return run;
}

/// A layout as failure messages name it.
inline std::string described(Layout const& l, int ranks, std::string const& schedule) {
  return "pp " + std::to_string(l.pp) + " x dp " + std::to_string(l.dp) + " x cp " + std::to_string(l.cp) + " x tp " +
         std::to_string(ranks / (l.pp * l.dp * l.cp)) + (l.fsdp ? ", FSDP over dp x cp" : "") +
         (l.method == sw::context_method::ring ? ", ring" : ", all-to-all") + ", " + schedule + ", " +
         std::to_string(l.microbatches) + " microbatches";
}

/// cp under FSDP (the whole model) against the unsharded run.
template <class Plan, class World>
void check_fsdp(World const& world, Layout const& l, Run const& serial, models::LlamaConfig const& c, int steps) {
  INFO(described(l, world.size(), "no pipeline"));
  Run const run = train_fsdp<Plan>(world, l, steps, c);
  REQUIRE(run.norms.size() == serial.norms.size());
  for (std::size_t i = 0; i < run.norms.size(); ++i)
    CHECK_MESSAGE(std::abs(run.norms[i] - serial.norms[i]) <= 1e-5 * serial.norms[i], "step " << i);
  llama_cases::check_same_run(run, serial, llama_context_cases::context_parameter_tolerance);
}

/// cp within pipeline stages against the unsharded run of the same microbatches.
template <class Plan, class Schedule, class World>
void check_pipeline(World const& world, Layout const& l, Schedule const& schedule, std::string const& name, int steps) {
  INFO(described(l, world.size(), name));
  llama_pipeline_cases::Setup const s{.dp = l.dp, .pp = l.pp, .microbatches = l.microbatches, .sequence = sequence};
  Run const got = train_pipeline<Plan>(world, l, s, schedule, steps);
  auto const mesh = sw::make_mesh<"pp", "rest">(world, {l.pp, world.size() / l.pp});  // pp: as train_pipeline's
  llama_pipeline_cases::check_against_unsharded(sw::submesh<"pp">(mesh), got, llama_pipeline_cases::unsharded(s, steps),
                                                llama_context_cases::context_parameter_tolerance);
}

/// Every composition that fits `world`: at 2 ranks cp 2 under FSDP over cp; at 4 ranks cp 2 x dp 2 under FSDP over
/// dp x cp, cp 2 x tp 2 (sequence parallelism) under FSDP over cp, and pp 2 x cp 2 with 1F1B, with ZB-H1 and with
/// FSDP over cp within the stages.
template <class World>
void check_all(World const& world, int steps) {
  int const n = world.size();
  auto c = llama_cases::small_config();
  c.sequence = sequence;
  if (n == 2 || n == 4) {
    auto const serial = llama_cases::train<sw::serial_plan>(sw::serial_world(), 1, steps, false, c);
    if (n == 2) check_fsdp<sw::serial_plan>(world, {.dp = 1, .cp = 2, .fsdp = true}, serial, c, steps);
    if (n == 4) {
      check_fsdp<sw::serial_plan>(world, {.dp = 2, .cp = 2, .fsdp = true}, serial, c, steps);
      check_fsdp<models::llama_plan<true>>(world, {.dp = 1, .cp = 2, .fsdp = true}, serial, c, steps);
    }
  }
  if (n == 4) {
    check_pipeline<sw::serial_plan>(world, {.cp = 2, .pp = 2, .microbatches = 3}, sw::OneFOneB{}, "1F1B", steps);
    check_pipeline<sw::serial_plan>(world, {.cp = 2, .pp = 2, .microbatches = 2}, sw::ZeroBubbleH1{}, "ZB-H1", steps);
    check_pipeline<sw::serial_plan>(world, {.cp = 2, .pp = 2, .fsdp = true, .microbatches = 2}, sw::OneFOneB{}, "1F1B",
                                    steps);
  }
}

}  // namespace llama_context_composed_cases
