#pragma once
// Gradient accumulation with the loss normalised over the step's valid tokens (sw::count_valid_tokens), in fp64 on
// the Qwen2-like config of llama_packed_cases: each step's batch is four rows of 15 tokens whose targets are masked
// as prompts are in supervised fine-tuning (ignore_index on a prompt of each row's own length), so that the data
// ranks hold 3 and 29 valid tokens (swapped every other step). Every layout trains on the four rows as microbatches
// (dp 2 x 2 microbatches, ± tp, ± ZeRO-1; FSDP dp 2 x 2; pp 2 x 4; cp 2 x 4) and is compared with the unsharded
// run over the four rows at once (one forward, the mean over every valid token): the accumulated gradients averaged
// over dp within 1e-12, losses within 1e-12 and parameters after 5 steps within 1e-10. The per-rank mean (each
// microbatch's own mean, halved) gives another gradient (worse than 1e-3): the comparison can fail.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <shardwise/context.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
#include <vector>

#include "llama_packed_cases.hpp"

namespace llama_accumulation_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using matrix = sw::nn::matrix<double>;
using llama_packed_cases::Result;

constexpr int steps = 5;
constexpr std::size_t row_tokens = 15;

/// The prompt of row `row` (0..3) at `step`: its first targets are ignored. Rows 0 and 1 keep 1 and 2 valid targets,
/// rows 2 and 3 all 15 and 14: 3 and 29 valid tokens for the two data ranks, swapped on odd steps.
inline std::size_t prompt(int step, int row) {
  std::size_t const prompts[4] = {14, 13, 0, 1};
  return prompts[(row + (step % 2) * 2) % 4];
}

/// Row `row`'s token ids (or prompt-masked targets) at `step`.
inline std::vector<std::int64_t> row_of(int step, int row, bool targets) {
  auto ids = llama_packed_cases::tokens(step * 4 + row, targets);
  if (targets)
    for (std::size_t i = 0; i < prompt(step, row); ++i) ids[i] = -100;
  return ids;
}

/// Rows [first, first + count) of `step`, ids or targets, one vector per row.
inline std::vector<std::vector<std::int64_t>> rows(int step, int first, int count, bool targets) {
  std::vector<std::vector<std::int64_t>> out;
  for (int r = first; r < first + count; ++r) out.push_back(row_of(step, r, targets));
  return out;
}

inline sw::AdamWOptions<double> adamw(bool zero1 = false) {
  return {.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0, .zero1 = zero1};
}

/// Every finished gradient, whole, averaged over `dp` as the optimizer averages them.
template <class Finished, class Dp>
std::vector<matrix> averaged_gradients(Finished finished, Dp const& dp) {
  std::vector<matrix> out;
  sw::for_each_parameter(finished, [&](std::string const&, auto const& p) {
    matrix g = sw::full_gradient(p);
    sw::all_reduce(dp, g, sw::Avg{});
    out.push_back(std::move(g));
  });
  return out;
}

/// The unsharded run: the four rows in one forward, the loss the mean over all their valid targets.
inline Result full_batch(models::LlamaConfig const& c) {
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::Llama<double> model(c);
  sw::parallelize(model, tp);
  sw::AdamW<double> optimizer(adamw());
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int64_t> ids, targets;
    for (int row = 0; row < 4; ++row) {
      auto const i = row_of(step, row, false), t = row_of(step, row, true);
      ids.insert(ids.end(), i.begin(), i.end()), targets.insert(targets.end(), t.begin(), t.end());
    }
    auto loss =
        models::llama_loss(tp, model.forward(ids, sw::sequence_lengths::every(row_tokens)), targets, c.vocabulary);
    model.backward(loss.dlogits);
    auto finished = sw::finish_gradients(model);
    if (step == 0) r.gradients = averaged_gradients(finished, dp);
    optimizer.step(finished, dp);
    sw::zero_grad(model);
    r.losses.push_back(loss.loss);
  }
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    r.parameters.push_back(sw::full_tensor(p)), r.names.push_back(name);
  });
  return r;
}

/// dp 2 x tp (the world's other half) with Plan: rank r's rows 2r and 2r + 1 as two microbatches, the loss
/// normalised over the step's valid tokens — or, with `per_rank_mean`, each microbatch's own mean, halved.
template <class Plan, class World>
Result dp_microbatches(World const& world, models::LlamaConfig const& c, bool zero1, bool per_rank_mean = false) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, world.size() / 2});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  models::Llama<double, Plan> model(c);
  sw::parallelize(model, tp);
  sw::AdamW<double> optimizer(adamw(zero1));
  Result r;
  for (int step = 0; step < steps; ++step) {
    auto const ids = rows(step, 2 * dp.rank(), 2, false), targets = rows(step, 2 * dp.rank(), 2, true);
    auto const tokens = sw::count_valid_tokens(dp, targets);
    double share = 0;
    for (std::size_t m = 0; m < 2; ++m) {
      auto logits = model.forward(ids[m], sw::sequence_lengths::every(row_tokens));
      if (per_rank_mean) {
        auto loss = models::llama_loss(tp, std::move(logits), targets[m], c.vocabulary);
        loss.dlogits.local *= 0.5;
        model.backward(loss.dlogits);
        share += loss.loss / 2;
      } else {
        auto loss = models::llama_loss(tp, std::move(logits), targets[m], c.vocabulary, tokens);
        model.backward(loss.dlogits);
        share += loss.loss;
      }
    }
    auto finished = sw::finish_gradients(model);
    if (step == 0) r.gradients = averaged_gradients(finished, dp);
    optimizer.step(finished, dp);
    sw::zero_grad(model);
    r.losses.push_back(per_rank_mean ? sw::all_reduce(dp, share, sw::Avg{}) : sw::all_reduce(dp, share, sw::Sum{}));
  }
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { r.parameters.push_back(sw::full_tensor(p)); });
  return r;
}

/// FSDP at dp 2 (full shard, a unit per block), rank r's two rows as two microbatches; with `sync_last_only`, the
/// first backward keeps its gradients unreduced (set_requires_gradient_sync(false)), as FSDP2 recipes accumulate.
template <class World>
Result fsdp_microbatches(World const& world, models::LlamaConfig const& c, bool sync_last_only) {
  auto const dp = sw::make_mesh<"dp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<double> model(c);
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
  sw::AdamW<double> optimizer(adamw());
  Result r;
  for (int step = 0; step < steps; ++step) {
    auto const ids = rows(step, 2 * dp.rank(), 2, false), targets = rows(step, 2 * dp.rank(), 2, true);
    auto const tokens = sw::count_valid_tokens(dp, targets);
    double share = 0;
    for (std::size_t m = 0; m < 2; ++m) {
      if (sync_last_only) sharded.set_requires_gradient_sync(m == 1);
      auto loss = models::llama_loss(tp, sharded.forward(ids[m], sw::sequence_lengths::every(row_tokens)), targets[m],
                                     c.vocabulary, tokens);
      sharded.backward(loss.dlogits);
      share += loss.loss;
    }
    optimizer.step(sharded);
    sw::zero_grad(sharded);
    r.losses.push_back(sw::all_reduce(dp, share, sw::Sum{}));
  }
  sharded.unshard();
  sw::for_each_parameter(sharded.model(),
                         [&](std::string const&, auto const& p) { r.parameters.push_back(sw::full_tensor(p)); });
  sharded.reshard();
  return r;
}

/// Pipeline stages (pp = the world's size) over the four rows as four microbatches (1F1B), each microbatch's loss
/// its share of the step's mean; this stage's parameters under their names.
template <class World>
Result pipeline_microbatches(World const& world, models::LlamaConfig const& c) {
  auto const pp = sw::make_mesh<"pp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::LlamaStage<double> stage(c, sw::stage_split(c.layers, world.size()), pp.rank());
  sw::parallelize(stage, tp);
  stage.microbatch_rows(std::vector<sw::sequence_lengths>(4, sw::sequence_lengths::every(row_tokens)));
  sw::AdamW<double> optimizer(adamw());
  Result r;
  for (int step = 0; step < steps; ++step) {
    auto const ids = rows(step, 0, 4, false), targets = rows(step, 0, 4, true);
    auto const tokens = sw::count_valid_tokens(dp, targets);
    double loss = 0;
    sw::run_pipeline_step(
        sw::OneFOneB{}, pp, std::span(&stage, 1), 4,
        [&](int m) { return std::span<const std::int64_t>(ids[std::size_t(m)]); },
        [&](int m, auto const& h) {
          auto result = stage.head_loss(tp, h, targets[std::size_t(m)], tokens);
          loss += result.loss;
          return result.gradient;
        });
    optimizer.step(sw::finish_gradients(stage), dp, pp);
    sw::zero_grad(stage);
    r.losses.push_back(sw::all_reduce(pp, stage.is_last() ? loss : 0.0, sw::Sum{}));
  }
  sw::for_each_parameter(stage, [&](std::string const& name, auto const& p) {
    if (p.mirror_of.empty()) r.parameters.push_back(sw::full_tensor(p)), r.names.push_back(name);
  });
  return r;
}

/// Each row one sequence cut over cp = the world's size (ring, balanced), the four rows as four microbatches: each
/// rank counts the valid targets of its tokens, summed over the data axis that holds cp.
template <class World>
Result cp_microbatches(World const& world, models::LlamaConfig c) {
  c.sequence = row_tokens;
  auto const cp = sw::submesh<"cp">(sw::make_mesh<"cp">(world, {world.size()}));
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(world, {world.size(), 1}));
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<double> model(c);
  sw::parallelize(model, tp);
  auto const context = sw::context_parallelize(model, cp, {c.sequence, world.size(), true}, sw::context_method::ring);
  sw::AdamW<double> optimizer(adamw());
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<std::int64_t>> ids, targets;
    for (int row = 0; row < 4; ++row)
      ids.push_back(context->my_tokens(row_of(step, row, false))),
          targets.push_back(context->my_tokens(row_of(step, row, true)));
    auto const tokens = sw::count_valid_tokens(data, targets);
    double share = 0;
    for (std::size_t m = 0; m < 4; ++m) {
      auto loss = models::llama_loss(tp, model.forward(ids[m], sw::sequence_lengths::every(row_tokens)), targets[m],
                                     c.vocabulary, tokens);
      model.backward(loss.dlogits);
      share += loss.loss;
    }
    optimizer.step(sw::finish_gradients(model), data);
    sw::zero_grad(model);
    r.losses.push_back(sw::all_reduce(data, share, sw::Sum{}));
  }
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { r.parameters.push_back(sw::full_tensor(p)); });
  return r;
}

/// A layout's run against the full batch's: gradients (where the run gives them) within 1e-12, each step's loss
/// within 1e-12 and the parameters after the steps within 1e-10 (by name where the run names them: a stage).
inline void check_against(Result const& got, Result const& full) {
  if (!got.gradients.empty()) llama_packed_cases::check_same(got.gradients, full.gradients, 1e-12, "gradient");
  REQUIRE(got.losses.size() == full.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    CHECK(std::abs(got.losses[s] - full.losses[s]) <= 1e-12 * std::abs(full.losses[s]));
  if (got.names.empty()) {
    llama_packed_cases::check_same(got.parameters, full.parameters, 1e-10, "parameter after the steps");
    return;
  }
  for (std::size_t i = 0; i < got.names.size(); ++i) {
    INFO(got.names[i]);
    auto const at = std::find(full.names.begin(), full.names.end(), got.names[i]);
    REQUIRE(at != full.names.end());
    CHECK(llama_packed_cases::relative_error(got.parameters[i],
                                             full.parameters[std::size_t(at - full.names.begin())]) <= 1e-10);
  }
}

/// Every layout the world's size serves against the full batch (2 ranks: dp 2 ± ZeRO-1, the per-rank mean's
/// difference, FSDP, pp 2, cp 2; 4 ranks: dp 2 x tp 2 ± SP, ZeRO-1).
template <class World>
void check_all(World const& world, models::LlamaConfig const& c, Result const& full) {
  if (world.size() == 2) {
    for (bool zero1 : {false, true}) {
      INFO("dp 2 x 2 microbatches, ZeRO-1 " << zero1);
      check_against(dp_microbatches<sw::serial_plan>(world, c, zero1), full);
    }
    Result const per_rank = dp_microbatches<sw::serial_plan>(world, c, false, true);
    double worst = 0;
    for (std::size_t i = 0; i < full.gradients.size(); ++i)
      worst = std::max(worst, llama_packed_cases::relative_error(per_rank.gradients[i], full.gradients[i]));
    CHECK(worst > 1e-3);  // 3 and 29 tokens weighted alike: not the full batch's gradient
    for (bool sync_last_only : {false, true}) {
      INFO("FSDP dp 2 x 2 microbatches, gradient sync " << (sync_last_only ? "on the last only" : "on each"));
      check_against(fsdp_microbatches(world, c, sync_last_only), full);
    }
    INFO("pp 2 x 4 microbatches");
    check_against(pipeline_microbatches(world, c), full);
    INFO("cp 2 x 4 microbatches");
    check_against(cp_microbatches(world, c), full);
  } else if (world.size() == 4) {
    INFO("dp 2 x tp 2 x 2 microbatches");
    check_against(dp_microbatches<models::llama_plan<false>>(world, c, false), full);
    check_against(dp_microbatches<models::llama_plan<true>>(world, c, true), full);
  }
}

}  // namespace llama_accumulation_cases
