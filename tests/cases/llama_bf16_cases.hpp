#pragma once
// bf16 products (sw::bf16_autocast) on the Qwen2-like config of llama_packed_cases, in float. A Linear's forward and
// both backward products equal the fp32 products of its operands rounded to bf16 (Eigen::bfloat16), within float's
// rounding of the sums, also after its weight changed. 5 AdamW steps under autocast at TP 2 and 4 (± SP), FSDP dp 2
// and 4 and dp x tp 2, cp 2 and 4 (ring; all-to-all at 2) and pp 2 (1F1B and zero-bubble H1) equal the unsharded run
// under autocast within the tolerances below (measured: logits 0, gradients 6.1e-3 at TP 4, losses 1.3e-4,
// parameters 7.9e-4), whose logits differ from the fp32 run's by 1.9e-3; the cp and pp runs' parameters are more than
// twice as near the autocast run's as the fp32 run's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <shardwise/context.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
#include <string>
#include <vector>

#include "llama_packed_cases.hpp"

namespace llama_bf16_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using fmatrix = sw::nn::matrix<float>;
using llama_packed_cases::Result;

/// Sharded against unsharded under autocast, each relative to the largest element of what it compares. The forward
/// rounds the same values alike; the gradients, whose partial sums are added in another order, can round to the
/// neighbouring bf16 value (2^-8 apart) and carry it back through a few layers.
inline constexpr double kLogitsTolerance = 1e-5, kGradientTolerance = 1e-2, kLossTolerance = 1e-3,
                        kParameterTolerance = 2e-3;

/// AdamW with an epsilon of 1e-2, near the gradients' elements (their norm clipped to 1 over 30,000 of them): with
/// torch's 1e-8, Adam's first steps move each element by the learning rate times the sign of its gradient, so the
/// last bf16 rounding of a near-zero gradient moves a weight by twice the learning rate either way.
inline sw::AdamWOptions<float> optimizer_options() {
  return {.learning_rate = 1e-2f, .eps = 1e-2f, .weight_decay = 0.1f, .max_grad_norm = 1.0f};
}

/// The losses and parameters (whole, in double) of a run.
template <class Model>
void keep_parameters(Model& model, Result& r) {
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    r.parameters.push_back(sw::full_tensor(p).template cast<double>()), r.names.push_back(name);
  });
}

/// `steps` AdamW steps of a Llama<float> with config `c` at TP = world size with Plan, under sw::bf16_autocast when
/// `bf16`, over `rows` packed rows at once (the mean over all their tokens).
template <class Plan, class World>
Result train(World const& world, bool bf16, int steps = 5, int rows = 1,
             models::LlamaConfig const& c = llama_packed_cases::config()) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::Llama<float, Plan> model(c);
  sw::parallelize(model, tp);
  std::optional<sw::bf16_autocast<models::Llama<float, Plan>>> autocast;
  if (bf16) autocast.emplace(model);
  sw::AdamW<float> optimizer(optimizer_options());
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int64_t> ids, targets;
    std::vector<std::size_t> lengths;
    for (int row = 0; row < rows; ++row) llama_packed_cases::packed_row(step, row, ids, targets, lengths);
    auto const logits = model.forward(ids, sw::sequence_lengths(lengths));
    auto const loss = models::llama_loss(tp, logits, targets, c.vocabulary);
    model.backward(loss.dlogits);
    auto finished = sw::finish_gradients(model);
    if (step == 0) {
      fmatrix whole = logits.local;
      if constexpr (!std::is_same_v<typename std::remove_cvref_t<decltype(logits)>::placement, sw::Replicate>)
        sw::all_gather(tp, logits.local, whole, -1);  // vocabulary-sharded logits, whole
      r.logits = whole.cast<double>();
      sw::for_each_parameter(finished, [&](std::string const&, auto const& p) {
        r.gradients.push_back(sw::full_gradient(p).template cast<double>());
      });
    }
    optimizer.step(finished, dp);
    sw::zero_grad(model);
    r.losses.push_back(loss.loss);
  }
  keep_parameters(model, r);
  return r;
}

/// The same steps under FSDP (full shard, a unit per block) on dp x tp = {world / tp_size, tp_size}, every dp rank
/// on the same rows (so that the run equals the unsharded one), under sw::bf16_autocast.
template <class World>
Result train_fsdp(World const& world, int tp_size, int steps = 5) {
  auto const c = llama_packed_cases::config();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {world.size() / tp_size, tp_size});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  using Model = models::Llama<float, models::llama_plan<false>>;
  Model model(c);
  sw::parallelize(model, tp);
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
  sw::bf16_autocast<Model> const autocast(model);
  sw::AdamW<float> optimizer(optimizer_options());
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int64_t> ids, targets;
    std::vector<std::size_t> lengths;
    llama_packed_cases::packed_row(step, 0, ids, targets, lengths);
    auto const loss =
        models::llama_loss(tp, sharded.forward(ids, sw::sequence_lengths(lengths)), targets, c.vocabulary);
    sharded.backward(loss.dlogits);
    optimizer.step(sharded);
    sw::zero_grad(sharded);
    r.losses.push_back(sw::all_reduce(dp, loss.loss, sw::Avg{}));
  }
  sharded.unshard();
  keep_parameters(sharded.model(), r);
  sharded.reshard();
  return r;
}

/// The same steps in pipeline stages under autocast (pp = the world's size, a stage each), two microbatches a step
/// (packed rows 0 and 1, each loss weighted by a half), under 1F1B or zero-bubble H1, whose W runs apart from its B
/// and rounds the output gradient again. The losses and this stage's parameters under their names.
template <class World>
Result train_pipeline(World const& world, bool zero_bubble, int steps = 5) {
  auto const c = llama_packed_cases::config();
  auto const pp = sw::make_mesh<"pp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  using Stage = models::LlamaStage<float>;
  Stage stage(c, sw::stage_split(c.layers, world.size()), pp.rank());
  sw::parallelize(stage, tp);
  sw::bf16_autocast<Stage> const autocast(stage);
  sw::AdamW<float> optimizer(optimizer_options());
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<std::int64_t>> ids(2), targets(2);
    std::vector<sw::sequence_lengths> rows;
    for (std::size_t m = 0; m < 2; ++m) {
      std::vector<std::size_t> lengths;
      llama_packed_cases::packed_row(step, int(m), ids[m], targets[m], lengths);
      rows.emplace_back(lengths);
    }
    stage.microbatch_rows(rows);
    double loss = 0;
    auto const input = [&](int m) { return std::span<const std::int64_t>(ids[std::size_t(m)]); };
    auto const loss_gradient = [&](int m, auto const& h) {
      auto result = stage.head_loss(tp, h, targets[std::size_t(m)], 0.5);
      loss += result.loss / 2;
      return result.gradient;
    };
    if (zero_bubble)
      sw::run_pipeline_step(sw::ZeroBubbleH1{}, pp, std::span(&stage, 1), 2, input, loss_gradient);
    else
      sw::run_pipeline_step(sw::OneFOneB{}, pp, std::span(&stage, 1), 2, input, loss_gradient);
    optimizer.step(sw::finish_gradients(stage), dp, pp);
    sw::zero_grad(stage);
    r.losses.push_back(sw::all_reduce(pp, stage.is_last() ? loss : 0.0, sw::Sum{}));
  }
  sw::for_each_parameter(stage, [&](std::string const& name, auto const& p) {
    if (p.mirror_of.empty())
      r.parameters.push_back(sw::full_tensor(p).template cast<double>()), r.names.push_back(name);
  });
  return r;
}

/// The config of the context-parallel runs: its capacity is a packed row's 15 tokens, the length the cut splits.
inline models::LlamaConfig row_config() {
  auto c = llama_packed_cases::config();
  c.sequence = 15;
  return c;
}

/// The same steps with each packed row cut over cp = the world's size (balanced) by `method`, under autocast: each
/// rank trains on its tokens of the row (the loss weighted by its share, the gradients averaged over cp).
template <class World>
Result train_cp(World const& world, sw::context_method method, int steps = 5) {
  auto const c = row_config();
  auto const cp = sw::submesh<"cp">(sw::make_mesh<"cp">(world, {world.size()}));
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(world, {world.size(), 1}));
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<float> model(c);
  sw::parallelize(model, tp);
  auto const context = sw::context_parallelize(model, cp, {c.sequence, world.size(), true}, method);
  sw::bf16_autocast<models::Llama<float>> const autocast(model);
  sw::AdamW<float> optimizer(optimizer_options());
  double const weight = context->mean_weight();
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int64_t> ids, targets;
    std::vector<std::size_t> lengths;
    llama_packed_cases::packed_row(step, 0, ids, targets, lengths);
    auto const logits = model.forward(context->my_tokens(ids), sw::sequence_lengths(lengths));
    auto loss = models::llama_loss(tp, logits, context->my_tokens(targets), c.vocabulary);
    loss.dlogits.local *= float(weight);
    model.backward(loss.dlogits);
    optimizer.step(sw::finish_gradients(model), data);
    sw::zero_grad(model);
    r.losses.push_back(sw::all_reduce(data, loss.loss * weight, sw::Avg{}));
  }
  keep_parameters(model, r);
  return r;
}

/// How far two runs are apart, each relative to the largest element of what it compares: the first step's logits and
/// gradients (where both runs have them), the losses, the parameters after the steps.
struct Distance {
  double logits = 0, gradients = 0, losses = 0, parameters = 0;
};

inline Distance distance(Result const& got, Result const& expected) {
  Distance d;
  if (got.logits.size() != 0 && expected.logits.size() != 0) {
    d.logits = llama_packed_cases::relative_error(got.logits, expected.logits);
    for (std::size_t i = 0; i < got.gradients.size(); ++i)
      d.gradients = std::max(d.gradients, llama_packed_cases::relative_error(got.gradients[i], expected.gradients[i]));
  }
  for (std::size_t i = 0; i < got.losses.size(); ++i)
    d.losses = std::max(d.losses, std::abs(got.losses[i] - expected.losses[i]) / std::abs(expected.losses[i]));
  for (std::size_t i = 0; i < got.parameters.size(); ++i)
    d.parameters =
        std::max(d.parameters, llama_packed_cases::relative_error(got.parameters[i], expected.parameters[i]));
  return d;
}

inline std::ostream& operator<<(std::ostream& out, Distance const& d) {
  return out << "logits " << d.logits << ", gradients " << d.gradients << ", losses " << d.losses << ", parameters "
             << d.parameters;
}

/// A Linear under autocast: y = x W^T + b, dx = dy W and dW = dy^T x against the fp32 products of x, W and dy rounded
/// to bf16; the bias's gradient is the column sums of dy, unrounded.
inline void check_linear() {
  auto const rounded = [](fmatrix const& m) -> fmatrix { return m.cast<Eigen::bfloat16>().cast<float>(); };
  auto const error = [](fmatrix const& got, fmatrix const& expected) {
    return llama_packed_cases::relative_error(got.cast<double>(), expected.cast<double>());
  };
  sw::Linear<float> plain(48, 33, 7, true), cast(48, 33, 7, true);
  sw::detail::bf16_scratch scratch;  // what sw::bf16_autocast holds for its Linears
  cast.shardwise_autocast_bf16(scratch);
  fmatrix x(5, 48), dy(5, 33);
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = float(std::sin(0.37 * double(i)));
  for (Eigen::Index i = 0; i < dy.size(); ++i) dy.data()[i] = float(std::cos(0.11 * double(i)));
  // Twice, the weight changed in between as an optimizer step changes it: the forward's rounded weight, which the
  // backward reuses, is the weight's of that step.
  fmatrix y;
  for (int step = 0; step < 2; ++step) {
    INFO("step " << step);
    if (step == 1) {
      plain.weight.array() += 0.125f, cast.weight = plain.weight;
      cast.weight_grad.setZero(), cast.bias_grad.setZero();
    }
    y = cast(sw::Activation<float, sw::Replicate>{x}).local;
    auto const dx = cast.backward(sw::Activation<float, sw::Replicate>{dy});
    fmatrix const w = rounded(plain.weight);
    CHECK(error(y, (rounded(x) * w.transpose()).rowwise() + plain.bias.transpose()) <= 1e-6);
    CHECK(error(dx.local, rounded(dy) * w) <= 1e-6);
    CHECK(error(cast.weight_grad, rounded(dy).transpose() * rounded(x)) <= 1e-6);
    CHECK(error(cast.bias_grad, dy.colwise().sum().transpose()) <= 1e-6);
  }
  auto const y32 = plain(sw::Activation<float, sw::Replicate>{x});  // and not the fp32 product
  CHECK(error(y, y32.local) > 1e-4);
  cast.shardwise_reset_precision();  // the scope's end: fp32 again
  auto const again = cast(sw::Activation<float, sw::Replicate>{x});
  CHECK(error(again.local, y32.local) <= 1e-6);
}

/// The largest distance of a run's parameters from those of the same names in `expected`.
inline double parameter_distance(Result const& got, Result const& expected) {
  double worst = 0;
  for (std::size_t i = 0; i < got.names.size(); ++i) {
    auto const at = std::find(expected.names.begin(), expected.names.end(), got.names[i]);
    REQUIRE(at != expected.names.end());
    worst = std::max(worst, llama_packed_cases::relative_error(
                                got.parameters[i], expected.parameters[std::size_t(at - expected.names.begin())]));
  }
  return worst;
}

/// A run's losses, and its parameters found by name in `expected`, within the tolerances above; and nearer to
/// `expected` than to `fp32` (the same unsharded run without autocast) by more than twice: the run was in bf16.
inline void check_by_name(Result const& got, Result const& expected, Result const& fp32, std::string const& what) {
  INFO(what);
  CHECK(2 * parameter_distance(got, expected) < parameter_distance(got, fp32));
  REQUIRE(got.losses.size() == expected.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    CHECK(std::abs(got.losses[s] - expected.losses[s]) <= kLossTolerance * std::abs(expected.losses[s]));
  REQUIRE(!got.names.empty());
  for (std::size_t i = 0; i < got.names.size(); ++i) {
    INFO(got.names[i]);
    auto const at = std::find(expected.names.begin(), expected.names.end(), got.names[i]);
    REQUIRE(at != expected.names.end());
    CHECK(llama_packed_cases::relative_error(
              got.parameters[i], expected.parameters[std::size_t(at - expected.names.begin())]) <= kParameterTolerance);
  }
}

/// Every parallel run under autocast against `alone` (the unsharded run under autocast).
template <class World>
void check_all(World const& world, Result const& alone) {
  auto const check = [&](Result const& got, char const* what) {
    Distance const d = distance(got, alone);
    INFO(what << ", " << world.size() << " ranks: " << d);
    CHECK(d.logits <= kLogitsTolerance);
    CHECK(d.gradients <= kGradientTolerance);
    CHECK(d.losses <= kLossTolerance);
    CHECK(d.parameters <= kParameterTolerance);
  };
  check(train<models::llama_plan<false>>(world, true), "TP");
  check(train<models::llama_plan<true>>(world, true), "TP + SP");
  check(train_fsdp(world, 1), "FSDP");
  if (world.size() % 2 == 0) check(train_fsdp(world, 2), "FSDP x TP 2");
  if (world.size() > 1) {  // cp: against the unsharded run on the row as the cut's capacity
    using unsharded = models::llama_plan<false>;
    Result const row_alone = train<unsharded>(sw::serial_world(), true, 5, 1, row_config());
    Result const row_fp32 = train<unsharded>(sw::serial_world(), false, 5, 1, row_config());
    check_by_name(train_cp(world, sw::context_method::ring), row_alone, row_fp32, "cp, ring");
    if (llama_packed_cases::config().kv_heads % std::size_t(world.size()) == 0)
      check_by_name(train_cp(world, sw::context_method::all_to_all), row_alone, row_fp32, "cp, all-to-all");
  }
  if (world.size() == 2) {  // pp 2 (the config's two blocks): against the unsharded run over both rows at once
    Result const two_rows = train<models::llama_plan<false>>(sw::serial_world(), true, 5, 2);
    Result const two_rows_fp32 = train<models::llama_plan<false>>(sw::serial_world(), false, 5, 2);
    check_by_name(train_pipeline(world, false), two_rows, two_rows_fp32, "pp 2, 1F1B");
    check_by_name(train_pipeline(world, true), two_rows, two_rows_fp32, "pp 2, zero-bubble H1");
  }
}

}  // namespace llama_bf16_cases
