// Expert parallelism (sw::expert_parallelize) against the unsharded block: models::MoeFeedForward with its 8 experts
// placed over 1, 2 or 4 ep ranks, each rank routing its own tokens (a different number on each), equals on every
// rank the unsharded block run on that rank's tokens (output, input gradient, router and shared-expert gradients,
// the load-balancing loss), and each placed expert's gradients equal the unsharded expert's summed over every
// rank's tokens; a MoeLlama trained so, its experts also cut over tp 2 (expert tensor parallelism) where the world
// has 2 or 4 ranks, equals the unsharded run. Written once for threads and MPI; fp64.
#pragma once

#include <doctest/doctest.h>

#include <cmath>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/moe.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

namespace expert_parallel_cases {
namespace sw = shardwise;
namespace models = shardwise::models;
using M = sw::nn::matrix<double>;
using Moe = models::MoeFeedForward<double>;

inline models::MoeConfig config(double capacity = 0) {
  models::MoeConfig c;
  c.dim = 6, c.expert_hidden = 5, c.experts = 8, c.top_k = 2, c.normalize_top_k = false;
  c.router_aux_loss_coef = 0.02, c.shared_expert_hidden = 4, c.capacity_factor = capacity;
  return c;
}

inline M random(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  M m(rows, cols);
  unsigned state = seed * 2654435761u + 1;
  for (Eigen::Index i = 0; i < m.size(); ++i) {
    state = state * 1664525u + 1013904223u;
    m.data()[i] = static_cast<double>(state >> 8) / double(1u << 24) * 2 - 1;
  }
  return m;
}
/// Rank q's tokens (5 + 3q of them: uneven) and its output gradient.
inline M tokens_of(int q) { return random(5 + 3 * q, 6, 10 + static_cast<unsigned>(q)); }
inline M gradient_of(int q) { return random(5 + 3 * q, 6, 50 + static_cast<unsigned>(q)); }

inline double gap(M const& got, M const& expected) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) return 1e30;
  if (got.size() == 0) return 0;
  return (got - expected).cwiseAbs().maxCoeff() / std::max(1.0, expected.cwiseAbs().maxCoeff());
}

/// Rank q's tokens, their first feature 1 where `forced`: with force_first_two's router, every token then goes to
/// experts 0 and 1.
inline M block_tokens(int q, bool forced) {
  M x = tokens_of(q);
  if (forced) x.col(0).setOnes();
  return x;
}
/// A router that sends every token of block_tokens(q, true) to experts 0 and 1 (logits about 10 and 9 against about
/// 0), whatever its other features.
inline void force_first_two(Moe& m) {
  m.gate.weight *= 0.01;
  m.gate.weight.col(0).setZero();
  m.gate.weight(0, 0) = 10.0, m.gate.weight(1, 0) = 9.0;
}

/// The block placed over the ep ranks against the unsharded one; `forced`: every token of every rank routed to
/// experts 0 and 1, both on ep rank 0 (the worst imbalance: its experts compute every rank's rows, the others'
/// none), where its expert rows are then ep size x every rank's tokens x top_k and the others' 0.
template <class World>
void check_placed_block(World const& world, double capacity, bool forced = false) {
  int const ranks = world.size(), me = world.rank();
  auto const ep = sw::make_mesh<"ep">(world, {ranks});
  Moe placed(config(capacity), 3), mine(config(capacity), 3), every(config(capacity), 3);
  if (forced) force_first_two(placed), force_first_two(mine), force_first_two(every);
  auto const where = sw::expert_parallelize(placed, sw::submesh<"ep">(ep));
  CHECK(where->size() == ranks);
  REQUIRE(placed.experts.size() == 8 / static_cast<std::size_t>(ranks));
  CHECK(placed.experts.first == 8 / static_cast<std::size_t>(ranks) * static_cast<std::size_t>(me));
  M const y = placed.forward(block_tokens(me, forced)).local;
  double const aux = placed.aux_loss();
  std::size_t const expert_rows = placed.expert_rows();
  M const dx = placed.backward(gradient_of(me)).local;
  M const y_mine = mine.forward(block_tokens(me, forced)).local;
  M const dx_mine = mine.backward(gradient_of(me)).local;
  std::size_t every_row = 0;
  for (int q = 0; q < ranks; ++q) {  // every rank's tokens through the unsharded experts: their gradients summed
    (void)every.forward(block_tokens(q, forced));
    (void)every.backward(gradient_of(q));
    every_row += static_cast<std::size_t>(block_tokens(q, forced).rows()) * 2;
  }
  if (forced) {
    INFO("every token to experts 0 and 1");
    CHECK(mine.routing().load(0) == static_cast<std::size_t>(y.rows()));
    CHECK(mine.routing().load(1) == static_cast<std::size_t>(y.rows()));
    CHECK(expert_rows == (me == 0 ? every_row : 0));
  }
  CHECK(gap(y, y_mine) < 1e-14);
  CHECK(gap(dx, dx_mine) < 1e-14);
  CHECK(aux == doctest::Approx(mine.aux_loss()).epsilon(1e-15));
  CHECK(gap(placed.gate.weight_grad, mine.gate.weight_grad) < 1e-14);
  CHECK(gap(placed.shared_expert->w2.weight_grad, mine.shared_expert->w2.weight_grad) < 1e-14);
  CHECK(gap(placed.shared_expert_gate->weight_grad, mine.shared_expert_gate->weight_grad) < 1e-14);
  for (std::size_t l = 0; l < placed.experts.size(); ++l) {
    auto const& whole = every.experts[placed.experts.first + l];
    INFO("expert " << placed.experts.first + l);
    CHECK(gap(placed.experts[l].w1.weight_grad, whole.w1.weight_grad) < 1e-14);
    CHECK(gap(placed.experts[l].w3.weight_grad, whole.w3.weight_grad) < 1e-14);
    CHECK(gap(placed.experts[l].w2.weight_grad, whole.w2.weight_grad) < 1e-14);
  }
  // Its parameters keep the names of the whole model's experts.
  std::vector<std::string> names;
  for (auto const& p : sw::detail::list_model<double>(placed, {.names = true}).parameters) names.push_back(p.name);
  CHECK(names.at(1) == "experts." + std::to_string(placed.experts.first) + ".w1.weight");
}

/// A MoeLlama of 2 blocks of `experts`, vocabulary 20, width 8, rows of 4.
inline models::LlamaConfig model_config(models::MoeConfig const& experts, unsigned seed) {
  models::LlamaConfig c;
  c.vocabulary = 20, c.dim = 8, c.layers = 2, c.heads = 2, c.kv_heads = 1, c.sequence = 4, c.seed = seed;
  c.moe = experts;
  return c;
}

/// A MoeLlama of 2 blocks of 8 experts placed over the ep ranks: each rank's logits and loss (cross-entropy and the
/// load-balancing loss pooled over the blocks) equal the unsharded model's on that rank's rows, and a placed expert's
/// gradient the unsharded one's summed over every rank's rows.
template <class World>
void check_placed_model(World const& world) {
  int const ranks = world.size(), me = world.rank();
  models::MoeConfig m = config();
  m.shared_expert_hidden = 0, m.normalize_top_k = true;
  models::LlamaConfig const c = model_config(m, 5);
  auto const ids = [](int q, bool targets) {
    std::vector<std::int64_t> v;
    for (int i = 0; i < 4 * (q + 1); ++i) v.push_back((q * 7 + i * 3 + (targets ? 1 : 0)) % 20);
    return v;
  };
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const train = [&](auto& model, int q) {
    auto result = models::llama_loss(tp, model.forward(ids(q, false)), ids(q, true), c.vocabulary);
    double const loss = result.loss + m.router_aux_loss_coef * model.router_aux_loss();
    model.backward(result.dlogits);
    return loss;
  };
  auto const ep = sw::make_mesh<"ep">(world, {ranks});
  models::MoeLlama<double> placed(c), mine(c), every(c);
  (void)sw::expert_parallelize(placed, sw::submesh<"ep">(ep));
  double const loss = train(placed, me);
  CHECK(loss == doctest::Approx(train(mine, me)).epsilon(1e-14));
  for (int q = 0; q < ranks; ++q) (void)train(every, q);
  for (std::size_t layer = 0; layer < 2; ++layer) {
    auto const& experts = placed.layers[layer].feed_forward.experts;
    for (std::size_t l = 0; l < experts.size(); ++l)
      CHECK(gap(experts[l].w2.weight_grad, every.layers[layer].feed_forward.experts[experts.first + l].w2.weight_grad) <
            1e-13);
  }
  CHECK(gap(placed.layers[1].attention.wq.weight_grad, mine.layers[1].attention.wq.weight_grad) < 1e-13);
}

/// The same MoeLlama trained 3 AdamW steps with its experts over the ep ranks, drawn from the data-parallel ranks
/// (ep_size of them, each expert's replicas the rest; 0: every dp rank), each its own rows, and (Plan, tp_size) cut
/// over tp: the attention as moe_llama_plan cuts it, and with moe_llama_plan<true, true> each expert's SwiGLU too
/// (expert tensor parallelism). Equal to the unsharded model trained on every dp rank's rows with their gradients
/// averaged (as data parallelism averages them): its losses, its clipped norms and its weights after the steps.
template <class Plan, class World>
void check_placed_training(World const& world, int tp_size, int ep_size = 0) {
  int const ranks = world.size() / tp_size;
  if (ep_size == 0) ep_size = ranks;
  models::MoeConfig m = config();
  m.expert_hidden = 6;  // tp 2 divides it, and the shared expert's 4, and the heads
  models::LlamaConfig c = model_config(m, 9);
  c.kv_heads = 2;
  auto const ids = [](int step, int q, bool targets) {
    std::vector<std::int64_t> v;
    for (int i = 0; i < 4 * (q + 1); ++i) v.push_back((step * 5 + q * 7 + i * 3 + (targets ? 1 : 0)) % 20);
    return v;
  };
  auto const alone = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const serial = sw::make_mesh<"dp">(sw::serial_world(), {1});
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {ranks, tp_size});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  int const me = dp.rank();
  auto const train = [&](auto& model, auto const& over, int step, int q) {
    auto result = models::llama_loss(over, model.forward(ids(step, q, false)), ids(step, q, true), c.vocabulary);
    model.backward(result.dlogits);
    return result.loss + m.router_aux_loss_coef * model.router_aux_loss();
  };
  sw::AdamWOptions<double> const options{.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 0.5};
  models::MoeLlama<double, Plan> placed(c);
  models::MoeLlama<double> whole(c);
  sw::parallelize(placed, tp);
  auto const layout = sw::make_mesh<"edp", "ep", "tp">(world, {ranks / ep_size, ep_size, tp_size});
  (void)sw::expert_parallelize(placed, sw::submesh<"ep">(layout), sw::submesh<"edp">(layout));  // drawn from dp
  sw::AdamW<double> placed_step(options), whole_step(options);
  for (int step = 0; step < 3; ++step) {
    double const loss = train(placed, tp, step, me);
    double const placed_norm = placed_step.step(sw::finish_gradients(placed), dp);
    sw::zero_grad(placed);
    double mine = 0;
    for (int q = 0; q < ranks; ++q) {
      double const l = train(whole, alone, step, q);
      if (q == me) mine = l;
    }
    sw::for_each_parameter(whole, [&](std::string const&, auto const& p) { *p.grad /= double(ranks); });
    double const whole_norm = whole_step.step(sw::finish_gradients(whole), serial);
    sw::zero_grad(whole);
    INFO("step " << step << ", tp " << tp_size << ", ep " << ep_size);
    CHECK(loss == doctest::Approx(mine).epsilon(1e-12));
    CHECK(placed_norm == doctest::Approx(whole_norm).epsilon(1e-12));
  }
  auto const& experts = placed.layers[1].feed_forward.experts;
  for (std::size_t l = 0; l < experts.size(); ++l) {  // w1's rows and w2's columns are this tp rank's share
    auto const& w1 = experts[l].w1.weight;
    auto const& w2 = experts[l].w2.weight;
    auto const& reference = whole.layers[1].feed_forward.experts[experts.first + l];
    CHECK(gap(w1, reference.w1.weight.middleRows(tp.rank() * w1.rows(), w1.rows())) < 1e-12);
    CHECK(gap(w2, reference.w2.weight.middleCols(tp.rank() * w2.cols(), w2.cols())) < 1e-12);
  }
  CHECK(gap(placed.layers[0].feed_forward.gate.weight, whole.layers[0].feed_forward.gate.weight) < 1e-12);
  if (ranks > 1) {  // a data-parallel mesh that is not the ep ranks is refused
    (void)train(placed, tp, 0, me);
    CHECK_THROWS_WITH_AS((void)placed_step.step(sw::finish_gradients(placed), serial),
                         doctest::Contains("ranks of mesh axis \"ep\" with a data-parallel mesh of 1; an expert's "
                                           "gradient sums every ep rank's tokens"),
                         sw::error);
  }
}

/// Every check above at this world's size, dropless and with a capacity, and the refusals.
template <class World>
void check_expert_parallel(World const& world) {
  check_placed_block(world, 0.0);
  check_placed_block(world, 1.0);  // each rank drops by its own tokens' capacity, as unsharded
  check_placed_block(world, 0.0, true);
  check_placed_model(world);
  check_placed_training<sw::serial_plan>(world, 1);
  if (world.size() % 2 == 0) {
    check_placed_training<models::moe_llama_plan<true, true>>(world, 2);
    check_placed_training<models::moe_llama_plan<true, true, true>>(world, 2);  // and sequence parallel
    check_placed_training<sw::serial_plan>(world, 1, world.size() / 2);         // ep: half the dp ranks
  }
  if (world.size() == 4) check_placed_training<models::moe_llama_plan<true, true>>(world, 2, 1);  // ep 1 of dp 2
  auto const ep = sw::make_mesh<"ep">(world, {world.size()});
  if (world.size() > 1) {  // placed twice
    Moe twice(config(), 3);
    (void)sw::expert_parallelize(twice, sw::submesh<"ep">(ep));
    CHECK_THROWS_WITH_AS((void)sw::expert_parallelize(twice, sw::submesh<"ep">(ep)),
                         "shardwise::expert_parallelize: the experts at \"\" are placed already; place a model's "
                         "experts once",
                         sw::error);
  }
  {  // the last rank's router meets a NaN: every rank refuses with its words, none waits for it
    Moe placed(config(), 3);
    (void)sw::expert_parallelize(placed, sw::submesh<"ep">(ep));
    M x = tokens_of(world.rank());
    if (world.rank() == world.size() - 1) x(2, 1) = std::nan("");
    CHECK_THROWS_WITH_AS(
        (void)placed.forward(x),
        ("shardwise::models::MoeFeedForward at \"\": the router's probabilities for token 2 of ep rank " +
         std::to_string(world.size() - 1) +
         " are not finite (its input or the router's weights hold NaN or infinity); check the "
         "model's inputs and learning rate")
            .c_str(),
        sw::error);
  }
  {  // rank 0 holds no tokens: it still takes part, with nothing to compute and no loss
    Moe placed(config(), 3), mine(config(), 3);
    (void)sw::expert_parallelize(placed, sw::submesh<"ep">(ep));
    M const x = world.rank() == 0 ? M(0, 6) : tokens_of(world.rank());
    M const dy = world.rank() == 0 ? M(0, 6) : gradient_of(world.rank());
    CHECK(gap(placed.forward(x).local, mine.forward(x).local) < 1e-14);
    CHECK(placed.aux_loss() == mine.aux_loss());
    CHECK(gap(placed.backward(dy).local, mine.backward(dy).local) < 1e-14);
    if (world.rank() == 0) CHECK(placed.aux_loss() == 0.0);
  }
  models::MoeConfig six = config();
  six.experts = 6;
  Moe uneven(six, 3);
  if (6 % world.size() != 0)
    CHECK_THROWS_WITH_AS(
        (void)sw::expert_parallelize(uneven, sw::submesh<"ep">(ep)),
        ("shardwise::expert_parallelize: the 6 experts at \"\" do not divide over the " + std::to_string(world.size()) +
         " ranks of mesh axis \"ep\"; each rank holds an equal share: choose an ep size that divides "
         "the experts")
            .c_str(),
        sw::error);
}

}  // namespace expert_parallel_cases
