// models::MoeFeedForward against a dense reference written here from the definition (every expert on every
// token, softmax, top-k, renormalisation, transformers' load-balancing loss), and its gradients against central
// differences of that reference. fp64.
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>
#include <shardwise/mesh/serial.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/moe.hpp>
#include <vector>

namespace moe_cases {
namespace sw = shardwise;
namespace models = shardwise::models;
using M = sw::nn::matrix<double>;
using Moe = models::MoeFeedForward<double>;

inline models::MoeConfig config(bool normalize, double aux, std::size_t shared = 0) {
  models::MoeConfig c;
  c.dim = 6, c.expert_hidden = 5, c.experts = 4, c.top_k = 2, c.normalize_top_k = normalize;
  c.router_aux_loss_coef = aux, c.shared_expert_hidden = shared;
  return c;
}

inline M random(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  M m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

/// The block's output for x and the training loss sum(y * r) + coef * aux, computed densely from its weights.
struct dense_result {
  M y;
  double loss = 0, aux = 0;
  std::vector<std::size_t> loads;
  std::size_t dropped = 0;
  std::vector<double> mean_probability;
};
inline dense_result dense(Moe& m, M const& x, M const& r) {
  auto const& c = m.config();
  auto const n = x.rows();
  auto const experts = static_cast<Eigen::Index>(c.experts);
  auto silu = [](double v) { return v / (1.0 + std::exp(-v)); };
  auto swiglu = [&](auto& f, Eigen::VectorXd const& v) -> Eigen::VectorXd {
    Eigen::VectorXd const h1 = f.w1.weight * v, h3 = f.w3.weight * v;
    return f.w2.weight * h1.unaryExpr(silu).cwiseProduct(h3);
  };
  dense_result out{M::Zero(n, x.cols()), 0, 0, std::vector<std::size_t>(c.experts, 0), 0, {}};
  std::vector<double> mean_probability(c.experts, 0.0);
  bool const sigmoid = c.router == models::moe_router::sigmoid;
  struct slot {
    Eigen::Index token;
    double weight;
  };
  std::vector<std::vector<slot>> slots(c.experts);  // per expert, in token order
  for (Eigen::Index t = 0; t < n; ++t) {
    Eigen::VectorXd z = m.gate.weight * x.row(t).transpose();
    Eigen::VectorXd p = (z.array() - z.maxCoeff()).exp();
    p /= p.sum();
    Eigen::VectorXd choice = p;
    if (sigmoid) {  // DeepSeek-V3: sigmoid scores; the bias only in the choice; groups scored by their best two
      p = z.unaryExpr([](double v) { return 1.0 / (1.0 + std::exp(-v)); });
      choice = p + m.score_correction_bias;
      Eigen::Index const per = experts / Eigen::Index(c.groups);
      std::vector<std::pair<double, Eigen::Index>> group_scores;
      for (Eigen::Index g = 0; g < Eigen::Index(c.groups); ++g) {
        std::vector<double> in(choice.data() + g * per, choice.data() + (g + 1) * per);
        std::sort(in.begin(), in.end(), std::greater<>());
        group_scores.emplace_back(-(in[0] + in[1]), g);  // ascending order = best first, ties to the lower group
      }
      std::sort(group_scores.begin(), group_scores.end());
      for (std::size_t rank = c.top_groups; rank < c.groups; ++rank)
        choice.segment(group_scores[rank].second * per, per).setConstant(-1e300);
    }
    std::vector<Eigen::Index> order(static_cast<std::size_t>(experts));
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](Eigen::Index a, Eigen::Index b) { return choice(a) > choice(b); });
    double total = sigmoid ? 1e-20 : 0.0;
    for (std::size_t j = 0; j < c.top_k; ++j) total += p(order[j]);
    for (std::size_t j = 0; j < c.top_k; ++j) {
      double const w = c.routed_scaling_factor * (c.normalize_top_k ? p(order[j]) / total : p(order[j]));
      slots[static_cast<std::size_t>(order[j])].push_back({t, w});
      ++out.loads[static_cast<std::size_t>(order[j])];
    }
    for (Eigen::Index e = 0; e < experts; ++e) mean_probability[static_cast<std::size_t>(e)] += p(e) / double(n);
    if (m.shared_expert) {  // Qwen2-MoE: + sigmoid(g . x) * shared(x); DeepSeek-V3: + shared(x)
      double const g = m.shared_expert_gate ? m.shared_expert_gate->weight.row(0).dot(x.row(t)) : 0.0;
      double const scale = m.shared_expert_gate ? 1.0 / (1.0 + std::exp(-g)) : 1.0;
      out.y.row(t) += scale * swiglu(*m.shared_expert, x.row(t).transpose()).transpose();
    }
  }
  // Megatron-Core's capacity: an expert computes at most ceil(factor * tokens * top_k / experts) tokens; "probs"
  // keeps those of the highest weights (the earlier token on a tie), "position" the first.
  auto const capacity = std::size_t(std::ceil(c.capacity_factor * double(n) * double(c.top_k) / double(c.experts)));
  for (std::size_t e = 0; e < c.experts; ++e) {
    auto kept = slots[e];
    if (c.capacity_factor > 0 && kept.size() > capacity) {
      if (c.drop_policy == models::moe_drop_policy::probs)
        std::stable_sort(kept.begin(), kept.end(), [](slot a, slot b) { return a.weight > b.weight; });
      out.dropped += kept.size() - capacity;
      kept.resize(capacity);
    }
    for (slot const& k : kept)
      out.y.row(k.token) += k.weight * swiglu(m.experts[e], x.row(k.token).transpose()).transpose();
  }
  for (std::size_t e = 0; e < c.experts; ++e)
    out.aux += double(out.loads[e]) / double(n) * mean_probability[e] * double(c.experts);
  out.loss = out.y.cwiseProduct(r).sum() + c.router_aux_loss_coef * out.aux;
  out.mean_probability = mean_probability;
  return out;
}

/// Checks the gradient of every `stride`-th entry of `value` (a parameter, or the input) against central
/// differences of `loss()`.
template <class Loss, class Grad>
void check_differences(Loss const& loss, M& value, Grad const& grad, char const* what, Eigen::Index stride) {
  double const h = 1e-6;
  for (Eigen::Index i = 0; i < value.size(); i += stride) {
    double const kept = value.data()[i];
    value.data()[i] = kept + h;
    double const up = loss();
    value.data()[i] = kept - h;
    double const down = loss();
    value.data()[i] = kept;
    INFO(what << " entry " << i);
    CHECK(grad.data()[i] == doctest::Approx((up - down) / (2 * h)).epsilon(1e-6));
  }
}

/// The same for one block's dense loss.
template <class Grad>
void check_entries(Moe& m, M& x, M const& r, M& value, Grad const& grad, char const* what) {
  check_differences([&] { return dense(m, x, r).loss; }, value, grad, what, 3);
}

TEST_CASE("MoeFeedForward: output, routing and aux loss equal a dense reference; gradients equal differences") {
  for (bool normalize : {true, false}) {
    for (double aux : {0.0, 0.25}) {
      INFO("normalize_top_k " << normalize << ", router_aux_loss_coef " << aux);
      Moe m(config(normalize, aux), 11);
      M x = random(9, 6, 3);
      M const r = random(9, 6, 4);
      dense_result const expected = dense(m, x, r);
      auto const y = m.forward(x);
      CHECK((y.local - expected.y).cwiseAbs().maxCoeff() < 1e-13);
      CHECK(m.aux_loss() == doctest::Approx(expected.aux).epsilon(1e-13));
      for (std::size_t e = 0; e < 4; ++e) CHECK(m.routing().load(e) == expected.loads[e]);
      std::size_t slots = 0;
      for (std::size_t e = 0; e < 4; ++e) slots += m.routing().load(e);
      CHECK(slots == 9 * 2);  // dropless: every token reaches its top_k experts

      sw::zero_grad(m);
      auto const dx = m.backward(r);
      check_entries(m, x, r, x, dx.local, "input");
      check_entries(m, x, r, m.gate.weight, m.gate.weight_grad, "gate.weight");
      for (std::size_t e : {0u, 3u}) {
        check_entries(m, x, r, m.experts[e].w1.weight, m.experts[e].w1.weight_grad, "w1");
        check_entries(m, x, r, m.experts[e].w2.weight, m.experts[e].w2.weight_grad, "w2");
      }
    }
  }
}

TEST_CASE("MoeFeedForward with Qwen2-MoE's shared expert: output and gradients equal the dense reference's") {
  Moe m(config(false, 0.1, 7), 13);
  REQUIRE(m.shared_expert);
  M x = random(8, 6, 5);
  M const r = random(8, 6, 6);
  dense_result const expected = dense(m, x, r);
  CHECK((m.forward(x).local - expected.y).cwiseAbs().maxCoeff() < 1e-13);
  sw::zero_grad(m);
  auto const dx = m.backward(r);
  check_entries(m, x, r, x, dx.local, "input");
  check_entries(m, x, r, m.shared_expert_gate->weight, m.shared_expert_gate->weight_grad, "shared_expert_gate");
  check_entries(m, x, r, m.shared_expert->w1.weight, m.shared_expert->w1.weight_grad, "shared_expert.w1");
  check_entries(m, x, r, m.shared_expert->w3.weight, m.shared_expert->w3.weight_grad, "shared_expert.w3");
  check_entries(m, x, r, m.shared_expert->w2.weight, m.shared_expert->w2.weight_grad, "shared_expert.w2");
  check_entries(m, x, r, m.gate.weight, m.gate.weight_grad, "gate");
}

inline models::MoeConfig deepseek_config(bool normalize) {
  models::MoeConfig c;
  c.dim = 6, c.expert_hidden = 5, c.experts = 8, c.top_k = 3, c.normalize_top_k = normalize;
  c.router = models::moe_router::sigmoid, c.groups = 4, c.top_groups = 2, c.routed_scaling_factor = 2.5;
  c.shared_expert_hidden = 4, c.shared_expert_gated = false;
  return c;
}

TEST_CASE(
    "MoeFeedForward with DeepSeek-V3's routing: sigmoid scores, a correction bias in the choice only, "
    "groups, a scaling factor and an ungated shared expert equal the dense reference") {
  for (bool normalize : {true, false}) {
    INFO("normalize_top_k " << normalize);
    Moe m(deepseek_config(normalize), 17);
    REQUIRE_FALSE(m.shared_expert_gate);
    m.score_correction_bias = random(8, 1, 21).col(0) * 0.3;  // steers the choice away from the best scores
    M x = random(10, 6, 22);
    M const r = random(10, 6, 23);
    dense_result const expected = dense(m, x, r);
    CHECK((m.forward(x).local - expected.y).cwiseAbs().maxCoeff() < 1e-13);
    for (std::size_t e = 0; e < 8; ++e) CHECK(m.routing().load(e) == expected.loads[e]);
    sw::zero_grad(m);
    auto const dx = m.backward(r);
    check_entries(m, x, r, x, dx.local, "input");
    check_entries(m, x, r, m.gate.weight, m.gate.weight_grad, "gate");
    check_entries(m, x, r, m.shared_expert->w2.weight, m.shared_expert->w2.weight_grad, "shared_expert.w2");
  }
}

TEST_CASE("MoeFeedForward::update_routing_bias: DeepSeek-V3's auxiliary-loss-free balancing") {
  // "At the end of each step, we will decrease the bias term by gamma if its corresponding expert is overloaded
  // and increase it by gamma if its corresponding expert is underloaded" (DeepSeek-V3, section 2.1.2): the loads
  // of the step's tokens against their mean, counted here from two microbatches' routing.
  Moe m(deepseek_config(true), 3);
  Eigen::VectorXd const before = m.score_correction_bias;
  std::vector<double> loads(8, 0.0);
  for (unsigned microbatch : {31u, 32u}) {
    M const x = random(12, 6, microbatch);
    (void)m.forward(x);
    for (std::size_t e = 0; e < 8; ++e) loads[e] += double(m.routing().load(e));
    (void)m.backward(random(12, 6, microbatch + 10));
  }
  (void)m.forward(random(12, 6, 40));  // a forward without backward (evaluation): not counted
  double const mean = (12.0 * 3 * 2) / 8;
  m.update_routing_bias(0.001);
  for (Eigen::Index e = 0; e < 8; ++e) {
    double const load = loads[std::size_t(e)];
    double const step = load > mean ? -0.001 : load < mean ? 0.001 : 0.0;
    CHECK(m.score_correction_bias(e) == doctest::Approx(before(e) + step).epsilon(1e-15));
  }
  for (std::size_t e = 0; e < 8; ++e) CHECK(m.pending_loads()[e] == 0);
  Moe softmax(config(true, 0.0), 1);
  CHECK_THROWS_WITH_AS(softmax.update_routing_bias(0.001),
                       "shardwise::models::MoeFeedForward at \"\": update_routing_bias needs the sigmoid router "
                       "(MoeConfig::router), whose choice the bias steers; the softmax router balances with "
                       "router_aux_loss_coef",
                       sw::error);
  auto bad = deepseek_config(true);
  bad.router_aux_loss_coef = 0.01;
  CHECK_THROWS_AS(Moe(bad, 1), sw::error);
  bad = deepseek_config(true);
  bad.groups = 3;
  CHECK_THROWS_WITH_AS(Moe(bad, 1),
                       "shardwise::models::MoeConfig: 8 experts in 3 groups, choosing among 2: the groups must divide "
                       "the experts and top_groups be in [1, groups]",
                       sw::error);
}

TEST_CASE("MoeFeedForward with a capacity factor: each expert drops beyond its capacity as the reference does") {
  for (auto policy : {models::moe_drop_policy::probs, models::moe_drop_policy::position}) {
    INFO("drop policy " << int(policy));
    auto c = config(true, 0.1);
    c.capacity_factor = 0.75, c.drop_policy = policy;  // 12 tokens x 2 / 4 experts x 0.75: 5 slots each
    Moe m(c, 19);
    m.gate.weight.row(1) *= 4.0;  // expert 1 is asked for more than its capacity
    M x = random(12, 6, 24);
    M const r = random(12, 6, 25);
    dense_result const expected = dense(m, x, r);
    REQUIRE(expected.dropped > 0);
    CHECK((m.forward(x).local - expected.y).cwiseAbs().maxCoeff() < 1e-13);
    std::size_t dropped = 0;
    for (std::size_t e = 0; e < 4; ++e) {
      CHECK(m.routing().load(e) == expected.loads[e]);
      CHECK(m.routing().computed(e) == std::min<std::size_t>(expected.loads[e], 5));
      dropped += m.routing().load(e) - m.routing().computed(e);
    }
    CHECK(dropped == expected.dropped);
    sw::zero_grad(m);
    auto const dx = m.backward(r);
    check_entries(m, x, r, x, dx.local, "input");
    check_entries(m, x, r, m.gate.weight, m.gate.weight_grad, "gate");
    check_entries(m, x, r, m.experts[1].w2.weight, m.experts[1].w2.weight_grad, "experts.1.w2");
  }
}

/// Two blocks in a row and transformers' load_balancing_loss_func over both (their router logits concatenated):
/// sum(y2 * r) + coef * experts * sum_e (all slots to e / all rows) * (mean probability of e over all rows).
inline double chained_loss(Moe& a, Moe& b, M const& x, M const& r, double coef, double* aux = nullptr) {
  dense_result const first = dense(a, x, M::Zero(x.rows(), x.cols()));
  dense_result const second = dense(b, first.y, r);
  double pooled = 0;
  for (std::size_t e = 0; e < first.loads.size(); ++e)
    pooled += double(first.loads[e] + second.loads[e]) / double(2 * x.rows()) *
              (first.mean_probability[e] + second.mean_probability[e]) / 2.0;
  pooled *= double(first.loads.size());
  if (aux) *aux = pooled;
  return second.y.cwiseProduct(r).sum() + coef * pooled;
}

TEST_CASE("models::load_balancing_loss pools several blocks as transformers does, and their backward follows it") {
  Moe a(config(true, 0.3), 41), b(config(true, 0.3), 42);
  M x = random(9, 6, 43);
  M const r = random(9, 6, 44);
  double expected_aux = 0;
  (void)chained_loss(a, b, x, r, 0.3, &expected_aux);
  auto const y1 = a.forward(x);
  (void)b.forward(y1);
  double const aux = models::load_balancing_loss(std::array{&a, &b});
  CHECK(aux == doctest::Approx(expected_aux).epsilon(1e-13));
  CHECK(aux != doctest::Approx((a.aux_loss() + b.aux_loss()) / 2).epsilon(1e-6));  // pooled, not averaged
  sw::zero_grad(a), sw::zero_grad(b);
  auto const dx = a.backward(b.backward(r));
  auto const chain = [&] { return chained_loss(a, b, x, r, 0.3); };
  check_differences(chain, x, dx.local, "input", 5);
  check_differences(chain, a.gate.weight, a.gate.weight_grad, "first gate", 5);
  check_differences(chain, b.gate.weight, b.gate.weight_grad, "second gate", 5);
  Moe other(config(true, 0.3), 45);
  auto wider = config(true, 0.3);
  wider.experts = 5;
  Moe five(wider, 46);
  (void)other.forward(x), (void)five.forward(x);
  CHECK_THROWS_WITH_AS(models::load_balancing_loss(std::array{&other, &five}),
                       "shardwise::models::load_balancing_loss: blocks of 4 and 5 experts; the loss pools blocks of "
                       "one expert count",
                       sw::error);
}

TEST_CASE("MoeFeedForward: an expert no token reaches computes on no rows and gets a zero gradient") {
  Moe m(config(true, 0.1), 5);
  m.gate.weight.row(2).setConstant(-50.0);  // with positive inputs, expert 2's logit is far below the others'
  M const x = (random(7, 6, 8).array().abs() + 0.1).matrix(), r = random(7, 6, 9);
  (void)m.forward(x);
  CHECK(m.routing().load(2) == 0);
  sw::zero_grad(m);
  auto const dx = m.backward(r);
  CHECK(m.experts[2].w1.weight_grad.cwiseAbs().maxCoeff() == 0.0);
  CHECK(m.experts[2].w2.weight_grad.cwiseAbs().maxCoeff() == 0.0);
  CHECK(m.gate.weight_grad.row(2).cwiseAbs().maxCoeff() > 0.0);  // the aux loss still pulls its probability
  CHECK(dx.local.allFinite());
}

TEST_CASE("MoeFeedForward: bad routing settings and a router producing NaN are named errors") {
  auto c = config(true, 0.0);
  c.top_k = 5;
  CHECK_THROWS_WITH_AS(Moe(c, 1),
                       "shardwise::models::MoeConfig: top_k 5 is not in [1, experts = 4]; route each token to "
                       "between 1 and 4 experts",
                       sw::error);
  c.top_k = 0;
  CHECK_THROWS_AS(Moe(c, 1), sw::error);
  Moe m(config(true, 0.0), 2);
  M x = random(3, 6, 1);
  x(1, 2) = std::nan("");
  CHECK_THROWS_WITH_AS((void)m.forward(x),
                       "shardwise::models::MoeFeedForward at \"\": the router's probabilities for token 1 are not "
                       "finite (its input or the router's weights hold NaN or infinity); check the model's inputs "
                       "and learning rate",
                       sw::error);
}

TEST_CASE("MoeFeedForward: declared lazily, nothing is allocated; its parameters are named as Mixtral's") {
  sw::Lazy<Moe> lazy(config(true, 0.0), sw::init(4));
  std::size_t held = 0;
  std::vector<std::string> names;
  sw::detail::for_each_parameter(lazy.unmaterialized(),
                                 [&](auto const& p) { held += static_cast<std::size_t>(p.value->size()); });
  CHECK(held == 0);
  Moe eager(config(true, 0.0), 4);
  for (auto const& p : sw::detail::list_model<double>(eager, {.names = true}).parameters) names.push_back(p.name);
  REQUIRE(names.size() == 1 + 4 * 3);
  CHECK(names[0] == "gate.weight");
  CHECK(names[1] == "experts.0.w1.weight");
  CHECK(names.back() == "experts.3.w2.weight");
}

/// A MoeLlama of 3 blocks of 4 experts, top-2, with the load-balancing loss in the training loss.
inline models::LlamaConfig moe_llama_config() {
  models::LlamaConfig c;
  c.vocabulary = 24, c.dim = 8, c.layers = 3, c.heads = 2, c.kv_heads = 1, c.sequence = 6, c.seed = 7;
  models::MoeConfig m;
  m.experts = 4, m.top_k = 2, m.expert_hidden = 6, m.router_aux_loss_coef = 0.05;
  c.moe = m;
  return c;
}

/// Every parameter's gradient after one forward and backward of `model` on a batch of two rows of 6.
template <class Model>
std::vector<double> moe_llama_gradients(Model& model) {
  std::vector<std::int64_t> ids, targets;
  for (int i = 0; i < 12; ++i) ids.push_back((i * 5 + 1) % 24), targets.push_back((i * 7 + 2) % 24);
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto result = models::llama_loss(tp, model.forward(ids), targets, 24);
  model.backward(result.dlogits);
  std::vector<double> grads;
  sw::detail::for_each_parameter(
      model, [&](auto const& p) { grads.insert(grads.end(), p.grad->data(), p.grad->data() + p.grad->size()); });
  return grads;
}

TEST_CASE("MoeLlama: its blocks' load-balancing loss is pooled; with activation checkpointing, the same gradients") {
  models::MoeLlama<double> plain(moe_llama_config()), checkpointed(moe_llama_config());
  checkpointed.checkpoint_blocks(true);
  std::vector<double> const expected = moe_llama_gradients(plain);
  // The recomputed forward keeps the loads pooled over the 3 blocks (each block's own would give other gradients).
  CHECK(moe_llama_gradients(checkpointed) == expected);
  std::vector<decltype(plain.layers[0].feed_forward)*> blocks;
  for (auto& b : plain.layers) blocks.push_back(&b.feed_forward);
  CHECK(plain.router_aux_loss() == doctest::Approx(models::load_balancing_loss(blocks)).epsilon(1e-15));
  CHECK(plain.router_aux_loss() > 0);
  // A dense config into the MoE type, and the other way, are refused by name.
  CHECK_THROWS_WITH_AS((models::MoeLlama<double>(models::LlamaConfig{})),
                       "shardwise::models::Llama: the config has no experts but the model type is a MoeLlama; "
                       "build models::Llama, or give the config a MoeConfig",
                       sw::error);
  CHECK_THROWS_WITH_AS((models::Llama<double>(moe_llama_config())),
                       "shardwise::models::Llama: the config has experts (moe) but the model type is dense; build "
                       "models::MoeLlama for a mixture of experts",
                       sw::error);
  CHECK_THROWS_WITH_AS((models::MoeLlama<double, sw::serial_plan, 6>(moe_llama_config())),
                       "shardwise::models::MoeFeedForward at \"layers.*.feed_forward\": the config has 4 experts but "
                       "the type 6; build the type its config describes",
                       sw::error);
}

}  // namespace moe_cases
