#pragma once
// Frozen parameters (sw::freeze) on the Qwen2-like config of llama_packed_cases in fp64: the embedding (and with it
// the tied output), every norm, every bias and all of the first block frozen, the second block's projections
// trained. Unsharded, the run equals training everything with the frozen values put back after each step (no
// clipping, whose norm would count them): within 1e-13. Frozen values stay bit for bit, their weights keep no
// gradient (the product that would fill it never runs), and the optimizer's state is two moments per trained
// element. TP 2 ± SP and dp 2 x tp 2 with ZeRO-1 equal the unsharded frozen run: losses and parameters after 5
// steps within 1e-10.
#include <doctest/doctest.h>

#include <cmath>
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "llama_packed_cases.hpp"

namespace llama_freeze_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using matrix = sw::nn::matrix<double>;
using llama_packed_cases::Result;

inline std::vector<std::string> frozen_patterns() {
  return {"tok_embeddings.weight", "*norm.weight", "*.bias", "layers.0.*"};
}

/// Whether a parameter name is one frozen_patterns() freezes (the test's own reading, not the library's).
inline bool frozen_name(std::string const& name) {
  return name == "tok_embeddings.weight" || name == "output.weight" || name.find("norm.weight") != std::string::npos ||
         name.ends_with(".bias") || name.starts_with("layers.0.");
}

/// 5 AdamW steps on dp x tp = {dp_size, world / dp_size} with Plan, dp rank r training on packed rows
/// [r * rows, r * rows + rows) of each step; with `freeze` the patterns frozen, else (`restore`) everything trained and
/// the frozen values put back after each step. `clip`: max_grad_norm. Checks what freezing promises on the way (values
/// kept, no gradients, state).
template <class Plan, class World>
Result train(World const& world, models::LlamaConfig const& c, int dp_size, bool zero1, bool freeze, double clip,
             int rows = 1) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, world.size() / dp_size});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  models::Llama<double, Plan> model(c);
  sw::parallelize(model, tp);
  if (freeze) CHECK(sw::freeze(model, frozen_patterns()) > 0);
  std::vector<matrix> initial;
  std::vector<std::string> names;
  sw::for_each_parameter(
      model, [&](std::string const& name, auto const& p) { initial.push_back(*p.value), names.push_back(name); });
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = clip, .zero1 = zero1});
  Result r;
  for (int step = 0; step < 5; ++step) {
    std::vector<std::int64_t> ids, targets;
    std::vector<std::size_t> lengths;
    for (int row = 0; row < rows; ++row)
      llama_packed_cases::packed_row(step, dp.rank() * rows + row, ids, targets, lengths);
    auto const loss = models::llama_loss(tp, model.forward(ids, sw::sequence_lengths(lengths)), targets, c.vocabulary);
    model.backward(loss.dlogits);
    if (freeze)
      sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
        if (!frozen_name(name)) return;
        INFO(name);
        if (p.leaf == "weight" && name.find("norm") == std::string::npos)
          CHECK(p.grad->size() == 0);  // the weight-gradient product never ran
        else
          CHECK((p.grad->size() == 0 || p.grad->isZero(0)));
      });
    optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
    if (!freeze) {
      std::size_t i = 0;
      sw::for_each_parameter(model, [&](std::string const&, auto const& p) {
        if (frozen_name(names[i])) *p.value = initial[i];
        ++i;
      });
    }
    r.losses.push_back(sw::all_reduce(dp, loss.loss, sw::Avg{}));
  }
  std::size_t i = 0;
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) {
    if (freeze && frozen_name(names[i])) CHECK(*p.value == initial[i]);  // bit for bit
    r.parameters.push_back(sw::full_tensor(p));
    ++i;
  });
  if (freeze) {  // two moments per trained element of this rank's shard (ZeRO-1: its slice; summed over dp)
    double const state = static_cast<double>(optimizer.state_elements());
    double const expected = 2.0 * static_cast<double>(sw::trainable_elements(model));
    CHECK(sw::all_reduce(dp, state, sw::Sum{}) == (zero1 ? expected : expected * dp_size));
    std::size_t all = 0;
    for (auto const& m : initial) all += static_cast<std::size_t>(m.size());
    CHECK(sw::trainable_elements(model) < all / 2);
  }
  return r;
}

inline void check_same_run(Result const& got, Result const& expected, double tolerance) {
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    CHECK(std::abs(got.losses[s] - expected.losses[s]) <= tolerance * std::abs(expected.losses[s]));
  llama_packed_cases::check_same(got.parameters, expected.parameters, tolerance, "parameter after the steps");
}

/// Unsharded (one rank): frozen equals trained-and-restored. At 2 ranks TP 2 ± SP, at 4 also dp 2 x tp 2 with
/// ZeRO-1 (against the unsharded frozen run over both dp ranks' rows), equal the unsharded frozen run.
template <class World>
void check_all(World const& world) {
  auto const c = llama_packed_cases::config();
  if (world.size() == 1) {
    Result const frozen = train<sw::serial_plan>(world, c, 1, false, true, 0.0);
    Result const restored = train<sw::serial_plan>(world, c, 1, false, false, 0.0);
    check_same_run(frozen, restored, 1e-13);
    CHECK(frozen.losses.back() < frozen.losses.front());
    return;
  }
  Result const serial = train<sw::serial_plan>(sw::serial_world(), c, 1, false, true, 1.0);
  INFO("TP " << world.size());
  check_same_run(train<models::llama_plan<false>>(world, c, 1, false, true, 1.0), serial, 1e-10);
  check_same_run(train<models::llama_plan<true>>(world, c, 1, false, true, 1.0), serial, 1e-10);
  if (world.size() == 4) {
    INFO("dp 2 x tp 2, ZeRO-1");
    Result const two_rows = train<sw::serial_plan>(sw::serial_world(), c, 1, false, true, 1.0, 2);
    check_same_run(train<models::llama_plan<true>>(world, c, 2, true, true, 1.0), two_rows, 1e-10);
  }
}

/// A pattern that matches nothing, and a freeze after fully_shard, are refused by name.
inline void check_refusals() {
  models::Llama<double> model(llama_packed_cases::config());
  CHECK_THROWS_WITH_AS(
      sw::freeze(model, {"layers.*.attention.wq.weight", "layers.*.atention.wk.weight"}),
      "shardwise::freeze: the pattern \"layers.*.atention.wk.weight\" matches no parameter of the "
      "model; patterns match the names sw::for_each_parameter gives (\"layers.0.attention.wq.weight\", "
      "\"*norm.weight\")",
      sw::error);
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
  auto sharded = sw::fully_shard<policy>(model, dp);
  CHECK_THROWS_WITH_AS(sw::freeze(model, {"layers.0.*"}),
                       "shardwise::freeze: the layer at \"tok_embeddings\" is under sw::fully_shard, which sharded its "
                       "parameters and their gradients as they were; freeze before fully_shard",
                       sw::error);
}

}  // namespace llama_freeze_cases
