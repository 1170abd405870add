// A MoeLlama cut into pipeline stages (models::MoeLlamaStage over "pp"), its experts placed over the data-parallel
// ranks ("dp", which are the ep ranks): each dp rank's step loss (the cross-entropy plus router_aux_loss_coef times
// the load-balancing loss pooled over every stage's blocks, as transformers pools its layers), the gradient norm and
// every parameter after 3 AdamW steps equal the unsharded MoeLlama trained on that rank's microbatches with
// gradient accumulation, its gradient averaged over the dp ranks (fp64, 1e-12). pp 1, 2 and 4, ep 1, 2 and 4; GPipe,
// 1F1B and ZB-H1, activations kept or recomputed per stage. Threads (test_llama_pipeline) and MPI
// (test_mpi_llama_pipeline).
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <shardwise/context.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
#include <string>
#include <vector>

namespace moe_pipeline_cases {
namespace sw = shardwise;
namespace models = shardwise::models;
using M = sw::nn::matrix<double>;

/// Four blocks of 4 experts (top-2, renormalised) and a gated shared expert; sequences of 4 tokens.
inline models::LlamaConfig config() {
  models::MoeConfig m;
  m.experts = 4, m.top_k = 2, m.normalize_top_k = true, m.expert_hidden = 6, m.shared_expert_hidden = 4;
  m.router_aux_loss_coef = 0.05;
  models::LlamaConfig c;
  c.vocabulary = 20, c.dim = 8, c.layers = 4, c.heads = 2, c.kv_heads = 1, c.sequence = 4, c.seed = 17;
  c.moe = m;
  return c;
}

/// Microbatch m of dp rank q at `step`: two sequences of 4 tokens (or their targets).
inline std::vector<std::int64_t> ids(int step, int q, int m, bool targets) {
  std::vector<std::int64_t> v;
  for (int i = 0; i < 8; ++i) v.push_back((step * 5 + q * 7 + m * 11 + i * 3 + i * i + (targets ? 1 : 0)) % 20);
  return v;
}

inline double gap(M const& got, M const& expected) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) return 1e30;
  return got.size() == 0 ? 0 : (got - expected).cwiseAbs().maxCoeff() / std::max(1.0, expected.cwiseAbs().maxCoeff());
}

constexpr int steps = 3, microbatches = 2;
inline sw::AdamWOptions<double> const options{.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 0.5};

/// The unsharded run of dp rank q: each step's loss (on q's microbatches) and gradient norm, and the trained model.
struct reference {
  std::vector<double> losses, norms;
  models::MoeLlama<double> model{config()};
};

inline reference unsharded(int dp_size, int q) {
  reference r;
  auto const alone = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const serial = sw::make_mesh<"dp">(sw::serial_world(), {1});
  double const coef = config().moe->router_aux_loss_coef;
  r.model.router_aux_loss_scale(1.0 / microbatches);  // the step's loss is its microbatches' mean
  sw::AdamW<double> optimizer(options);
  for (int step = 0; step < steps; ++step) {
    double mine = 0;
    for (int rank = 0; rank < dp_size; ++rank)
      for (int m = 0; m < microbatches; ++m) {
        auto result = models::llama_loss(alone, r.model.forward(ids(step, rank, m, false)), ids(step, rank, m, true),
                                         config().vocabulary);
        result.dlogits.local /= double(microbatches);
        r.model.backward(result.dlogits);
        if (rank == q) mine += (result.loss + coef * r.model.router_aux_loss()) / microbatches;
      }
    sw::for_each_parameter(r.model, [&](std::string const&, auto const& p) { *p.grad /= double(dp_size); });
    r.norms.push_back(optimizer.step(sw::finish_gradients(r.model), serial));
    sw::zero_grad(r.model);
    r.losses.push_back(mine);
  }
  return r;
}

/// Trains this rank's stage of a dp x pp mesh of `world` with `schedule` and checks it against the unsharded run.
template <class Schedule, class World>
void check_stages(World const& world, int pp_size, Schedule const& schedule,
                  sw::stage_activations activations = sw::stage_activations::keep) {
  int const dp_size = world.size() / pp_size;
  auto const mesh = sw::make_mesh<"dp", "pp">(world, {dp_size, pp_size});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const pp = sw::submesh<"pp">(mesh);
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::LlamaConfig const c = config();
  models::MoeLlamaStage<double> stage(c, sw::stage_split(c.layers, pp_size), pp.rank());
  (void)sw::expert_parallelize(stage, dp);  // the experts over the data-parallel ranks
  sw::AdamW<double> optimizer(options);
  reference expected = unsharded(dp_size, dp.rank());
  for (int step = 0; step < steps; ++step) {
    double step_loss = 0;
    auto const input = [&](int m) { return ids(step, dp.rank(), m, false); };
    auto const loss_gradient = [&](int m, auto const& h) {
      auto result = stage.head_loss(tp, h, ids(step, dp.rank(), m, true), 1.0 / microbatches);
      step_loss += (result.loss + c.moe->router_aux_loss_coef * stage.router_aux_loss()) / microbatches;
      return result.gradient;
    };
    sw::run_pipeline_step(schedule, pp, std::span(&stage, 1), microbatches, input, loss_gradient,
                          sw::pipeline_options{activations});
    double const norm = optimizer.step(sw::finish_gradients(stage), dp, pp);
    sw::zero_grad(stage);
    double const loss = sw::all_reduce(pp, stage.is_last() ? step_loss : 0.0, sw::Sum{});
    INFO("step " << step << ", pp " << pp_size << ", dp " << dp_size);
    CHECK(loss == doctest::Approx(expected.losses[static_cast<std::size_t>(step)]).epsilon(1e-12));
    CHECK(norm == doctest::Approx(expected.norms[static_cast<std::size_t>(step)]).epsilon(1e-12));
  }
  std::map<std::string, M> trained;
  sw::for_each_parameter(expected.model, [&](std::string const& name, auto const& p) { trained[name] = *p.value; });
  int compared = 0;
  sw::for_each_parameter(stage, [&](std::string const& name, auto const& p) {
    INFO(name);
    CHECK(gap(*p.value, trained.at(name)) < 1e-12);
    ++compared;
  });
  CHECK(compared > 0);
  int const experts_here = static_cast<int>(stage.layers[0].feed_forward.experts.size());
  CHECK(experts_here == 4 / dp_size);
}

/// The load-balancing loss pools every stage's blocks: a stage that counted only its own would give another loss and
/// other router gradients. Every pipeline of the world's ranks that its size allows.
template <class World>
void check_all(World const& world) {
  int const n = world.size();
  {  // not built: a stage of experts under cp would pool each cp rank's router totals alone
    models::MoeLlamaStage<double> stage(config(), sw::stage_split(config().layers, 1), 0);
    auto const cp = sw::make_mesh<"cp">(sw::serial_world(), {1});
    CHECK_THROWS_WITH_AS((void)sw::context_parallelize(stage, cp, {config().sequence, 1, false}),
                         doctest::Contains("context parallelism of a stage of experts (MoeLlamaStage) is not built"),
                         sw::error);
  }
  check_stages(world, std::min(n, 4), sw::OneFOneB{});  // 8 ranks: pp 4 x ep 2
  if (n >= 2) {
    check_stages(world, 2, sw::GPipe{}, sw::stage_activations::recompute);
    check_stages(world, 2, sw::ZeroBubbleH1{});
  }
}

}  // namespace moe_pipeline_cases
