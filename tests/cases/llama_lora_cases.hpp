#pragma once
// LoRA adapters (sw::add_lora) on the attention projections of the Qwen2-like config of llama_packed_cases, fp64.
// The adapters' gradients equal those the chain rule gives from the merged weight's (dB = s dW' A^T, dA = s B^T dW',
// where W' = W + s B A is the weight of the same model merged, trained in full): within 1e-12. Merging leaves the
// logits as they were (1e-12). 5 AdamW steps on the adapters alone leave every base weight bit for bit and keep
// two moments per adapter element; at TP 2 and 4 (± SP; at 4 the key-value heads repeated, so B's copies too),
// dp 2 x tp 2 with ZeRO-1, FSDP dp 2 and dp 2 x tp 2 (the frozen base gathered, never reduced nor stepped) and
// pp 2 (two microbatches) the losses and adapters equal the unsharded run's within 1e-10.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/peft.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "llama_packed_cases.hpp"

namespace llama_lora_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using matrix = sw::nn::matrix<double>;
using llama_packed_cases::Result;

inline sw::LoraConfig lora() { return {.rank = 4, .alpha = 8, .target_modules = {"layers.*.attention.w[qkvo]"}}; }

/// The adapters' elements by the formula, r (in + out) per adapted projection: q and o between dim and the query
/// heads, k and v from dim to the key-value heads.
inline std::size_t adapter_elements(models::LlamaConfig const& c, std::size_t r) {
  std::size_t const q = c.heads * c.head_dim(), kv = c.kv_heads * c.head_dim();
  return c.layers * r * (2 * (c.dim + q) + 2 * (c.dim + kv));
}

/// Fills every adapter's B with small values of its own (they start at zero, which would leave A's gradient zero).
template <class Model>
void fill_b(Model& model) {
  sw::for_each_parameter(model, [](std::string const& name, auto const& p) {
    if (!name.ends_with("lora_B.weight")) return;
    for (Eigen::Index i = 0; i < p.value->size(); ++i)
      p.value->data()[i] = 0.01 * std::cos(double(i) + double(name.size()));
  });
}

/// The adapters' gradients against the chain rule through the merged weight (unsharded).
inline void check_gradients_by_chain_rule() {
  auto const c = llama_packed_cases::config();
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<double> adapted(c);
  sw::parallelize(adapted, tp);
  REQUIRE(sw::add_lora(adapted, lora()) == 2 * 4);
  fill_b(adapted);
  models::Llama<double> merged = adapted;
  sw::merge_lora(merged);
  sw::for_each_parameter(merged, [](std::string const&, auto const& p) { *p.frozen = false; });  // trained in full
  sw::zero_grad(merged);
  std::vector<std::int64_t> ids, targets;
  std::vector<std::size_t> lengths;
  llama_packed_cases::packed_row(0, 0, ids, targets, lengths);
  auto const a = models::llama_loss(tp, adapted.forward(ids, sw::sequence_lengths(lengths)), targets, c.vocabulary);
  auto const m = models::llama_loss(tp, merged.forward(ids, sw::sequence_lengths(lengths)), targets, c.vocabulary);
  CHECK(llama_packed_cases::relative_error(a.dlogits.local, m.dlogits.local) <= 1e-12);  // the same logits' loss
  adapted.backward(a.dlogits);
  merged.backward(m.dlogits);
  double const s = sw::lora_scale(lora());
  for (std::size_t layer = 0; layer < c.layers; ++layer) {
    auto check = [&](auto& lin, auto const& merged_lin, char const* which) {
      INFO("layer " << layer << " " << which);
      auto const params = lin.parameters();
      matrix const& A = *std::get<2>(params).value;
      matrix const& B = *std::get<3>(params).value;
      matrix const& dw = merged_lin.weight_grad;
      CHECK(llama_packed_cases::relative_error(*std::get<3>(params).grad, s * dw * A.transpose()) <= 1e-12);
      CHECK(llama_packed_cases::relative_error(*std::get<2>(params).grad, s * B.transpose() * dw) <= 1e-12);
      CHECK(lin.weight_grad.size() == 0);  // the frozen base weight's product never ran
    };
    auto& with = adapted.layers[layer].attention;
    auto const& plain = merged.layers[layer].attention;
    check(with.wq, plain.wq, "wq");
    check(with.wk, plain.wk, "wk");
    check(with.wv, plain.wv, "wv");
    check(with.wo, plain.wo, "wo");
  }
}

/// 5 AdamW steps of the adapters on dp x tp = {dp_size, world / dp_size} with Plan, dp rank r on packed rows
/// [r * rows, r * rows + rows); checks that the base stays bit for bit and the state is the adapters' alone, that
/// merging keeps the logits; returns the losses and every adapter whole (by name).
template <class Plan, class World>
Result train(World const& world, int dp_size, bool zero1, int rows = 1) {
  auto const c = llama_packed_cases::config();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, world.size() / dp_size});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  models::Llama<double, Plan> model(c);
  sw::parallelize(model, tp);
  sw::add_lora(model, lora());
  std::vector<matrix> base;
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    if (!name.ends_with("lora_A.weight") && !name.ends_with("lora_B.weight")) base.push_back(*p.value);
  });
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0, .zero1 = zero1});
  Result r;
  std::vector<std::int64_t> ids, targets;
  std::vector<std::size_t> lengths;
  for (int step = 0; step < 5; ++step) {
    ids.clear(), targets.clear(), lengths.clear();
    for (int row = 0; row < rows; ++row)
      llama_packed_cases::packed_row(step, dp.rank() * rows + row, ids, targets, lengths);
    auto const loss = models::llama_loss(tp, model.forward(ids, sw::sequence_lengths(lengths)), targets, c.vocabulary);
    model.backward(loss.dlogits);
    optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
    r.losses.push_back(sw::all_reduce(dp, loss.loss, sw::Avg{}));
  }
  std::size_t i = 0;
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    if (name.ends_with("lora_A.weight") || name.ends_with("lora_B.weight")) {
      r.parameters.push_back(sw::full_tensor(p)), r.names.push_back(name);
    } else {
      INFO(name);
      CHECK(*p.value == base[i++]);  // bit for bit
    }
  });
  double const state = static_cast<double>(optimizer.state_elements());
  double const expected = 2.0 * static_cast<double>(sw::trainable_elements(model));
  CHECK(sw::all_reduce(dp, state, sw::Sum{}) == (zero1 ? expected : expected * dp_size));
  if (world.size() == 1)  // the bytes of the state: two moments of every adapter element, by the formula
    CHECK(optimizer.state_elements() * sizeof(double) == 2 * adapter_elements(c, lora().rank) * sizeof(double));
  // Merged, the model gives the logits it gave with its adapters (on this rank's last batch).
  matrix const before = llama_packed_cases::whole_logits(tp, model.forward(ids, sw::sequence_lengths(lengths)));
  sw::merge_lora(model);
  matrix const after = llama_packed_cases::whole_logits(tp, model.forward(ids, sw::sequence_lengths(lengths)));
  CHECK(llama_packed_cases::relative_error(after, before) <= 1e-12);
  return r;
}

/// A folder every rank of `world` names alike (world rank 0's process id): the same for threads and processes.
template <class World>
std::filesystem::path shared_folder(World const& world, std::string const& name) {
  auto const all = sw::make_mesh<"all">(world, {world.size()});
  double const id = sw::all_reduce(all, world.rank() == 0 ? double(::getpid()) : 0.0, sw::Max{});
  return std::filesystem::temp_directory_path() /
         ("shardwise_lora_" + name + "_" + std::to_string(std::int64_t(id)) + "_" + std::to_string(world.size()));
}

/// 5 AdamW steps of the adapters under FSDP (full shard, a unit per block) on dp x tp = {world / tp_size, tp_size},
/// dp rank r on packed row r: the frozen base gathered for compute and never reduced, its values bit for bit after;
/// the optimizer's state two moments per adapter element, over the dp ranks' shards. Saved with the optimizer after
/// 3 steps and loaded into a second sharded model, which then takes steps 4 and 5 bit for bit as the first; the
/// adapters saved in peft's files at the end load into an unsharded model bit for bit. Returns the losses and every
/// adapter whole.
template <class Plan, class World>
Result train_fsdp(World const& world, int tp_size) {
  auto const c = llama_packed_cases::config();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {world.size() / tp_size, tp_size});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
  models::Llama<double, Plan> model(c), resumed_model(c);
  for (auto* m : {&model, &resumed_model}) sw::parallelize(*m, tp), sw::add_lora(*m, lora());  // B zero, as train()'s
  std::vector<matrix> base;
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") == std::string::npos) base.push_back(*p.value);
  });
  double const adapters = static_cast<double>(sw::trainable_elements(model));
  auto sharded = sw::fully_shard<policy>(model, dp), resumed = sw::fully_shard<policy>(resumed_model, dp);
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0}),
      resumed_optimizer(optimizer.options());
  auto const step = [&](auto& on, sw::AdamW<double>& with, int s) {
    std::vector<std::int64_t> ids, targets;
    std::vector<std::size_t> lengths;
    llama_packed_cases::packed_row(s, dp.rank(), ids, targets, lengths);
    auto const loss = models::llama_loss(tp, on.forward(ids, sw::sequence_lengths(lengths)), targets, c.vocabulary);
    on.backward(loss.dlogits);
    with.step(on);
    sw::zero_grad(on);
    return sw::all_reduce(dp, loss.loss, sw::Sum{}) / dp.size();
  };
  auto const checkpoint = shared_folder(world, "fsdp_checkpoint"), adapter = shared_folder(world, "fsdp_adapter");
  Result r;
  for (int s = 0; s < 5; ++s) {
    r.losses.push_back(step(sharded, optimizer, s));
    if (s == 2) sw::save_sharded(sharded, optimizer, tp, checkpoint, 3);
  }
  sw::load_sharded(resumed, resumed_optimizer, tp, checkpoint);
  for (int s = 3; s < 5; ++s) CHECK(step(resumed, resumed_optimizer, s) == r.losses[std::size_t(s)]);  // bit for bit
  double const state = sw::all_reduce(dp, static_cast<double>(optimizer.state_elements()), sw::Sum{});
  CHECK(state == 2 * adapters);  // the adapters' moments, cut over dp; none for the frozen base
  sw::save_lora(sharded, tp, adapter, lora());
  sharded.unshard();
  std::size_t i = 0;
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") != std::string::npos) {
      r.parameters.push_back(sw::full_tensor(p)), r.names.push_back(name);
    } else {
      INFO(name);
      CHECK(*p.value == base[i++]);  // bit for bit
    }
  });
  sharded.reshard();
  models::Llama<double> unsharded(c);  // the adapters saved under FSDP, read back whole
  sw::load_lora(unsharded, sw::make_mesh<"tp">(sw::serial_world(), {1}), adapter);
  std::size_t k = 0;
  sw::for_each_parameter(unsharded, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") == std::string::npos) return;
    INFO(name);
    CHECK(*p.value == r.parameters[k++]);
  });
  sw::barrier(mesh);
  if (world.rank() == 0) std::filesystem::remove_all(checkpoint), std::filesystem::remove_all(adapter);
  return r;
}

/// 5 AdamW steps of the adapters in pipeline stages (pp = the world's size, 1F1B), packed rows 0 and 1 as two
/// microbatches, each microbatch's loss its share of the step's mean over both (sw::count_valid_tokens); the
/// frozen base (the tied embedding's copy on the last stage too) bit for bit after. Returns the losses and this
/// stage's adapters whole.
template <class World>
Result train_pipeline(World const& world) {
  auto const c = llama_packed_cases::config();
  auto const pp = sw::make_mesh<"pp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::LlamaStage<double> stage(c, sw::stage_split(c.layers, world.size()), pp.rank());
  sw::parallelize(stage, tp);
  sw::add_lora(stage, lora());  // B zero, as train()'s
  std::vector<matrix> base;
  sw::for_each_parameter(stage, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") == std::string::npos) base.push_back(*p.value);
  });
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0});
  Result r;
  for (int step = 0; step < 5; ++step) {
    std::vector<std::vector<std::int64_t>> ids(2), targets(2);
    std::vector<sw::sequence_lengths> lengths;
    for (int m = 0; m < 2; ++m) {
      std::vector<std::size_t> documents;
      llama_packed_cases::packed_row(step, m, ids[std::size_t(m)], targets[std::size_t(m)], documents);
      lengths.emplace_back(documents);
    }
    stage.microbatch_rows(lengths);
    auto const tokens = sw::count_valid_tokens(dp, targets);
    double loss = 0;
    sw::run_pipeline_step(
        sw::OneFOneB{}, pp, std::span(&stage, 1), 2,
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
  std::size_t i = 0;
  sw::for_each_parameter(stage, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") != std::string::npos) {
      r.parameters.push_back(sw::full_tensor(p)), r.names.push_back(name);
    } else {
      INFO(name);
      CHECK(*p.value == base[i++]);  // bit for bit
    }
  });
  return r;
}

/// A stage's run against the unsharded one: losses within 1e-10, and each of its adapters within 1e-10 of the
/// unsharded run's of that name.
inline void check_stage(Result const& got, Result const& expected) {
  REQUIRE(got.losses.size() == expected.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    CHECK(std::abs(got.losses[s] - expected.losses[s]) <= 1e-10 * std::abs(expected.losses[s]));
  CHECK(!got.names.empty());
  for (std::size_t i = 0; i < got.names.size(); ++i) {
    INFO(got.names[i]);
    auto const at = std::find(expected.names.begin(), expected.names.end(), got.names[i]);
    REQUIRE(at != expected.names.end());
    llama_packed_cases::check_same({got.parameters[i]}, {expected.parameters[std::size_t(at - expected.names.begin())]},
                                   1e-10, "adapter after the steps");
  }
}

/// A run against the unsharded one: losses within 1e-10 and every adapter (by name) within 1e-10.
inline void check_same(Result const& got, Result const& expected) {
  REQUIRE(got.losses.size() == expected.losses.size());
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    CHECK(std::abs(got.losses[s] - expected.losses[s]) <= 1e-10 * std::abs(expected.losses[s]));
  REQUIRE(got.names == expected.names);
  llama_packed_cases::check_same(got.parameters, expected.parameters, 1e-10, "adapter after the steps");
}

/// One rank: the chain rule, and the unsharded run learns. 2 and 4 ranks: TP ± SP; 2: FSDP dp 2 and pp 2; 4: dp 2 x
/// tp 2 with ZeRO-1, and FSDP dp 2 x tp 2.
template <class World>
void check_all(World const& world) {
  if (world.size() == 1) {
    check_gradients_by_chain_rule();
    Result const serial = train<sw::serial_plan>(world, 1, false);
    CHECK(serial.losses.back() < serial.losses.front());
    return;
  }
  Result const serial = train<sw::serial_plan>(sw::serial_world(), 1, false);
  INFO("TP " << world.size());
  check_same(train<models::llama_plan<false>>(world, 1, false), serial);
  check_same(train<models::llama_plan<true>>(world, 1, false), serial);
  Result const serial_rows = train<sw::serial_plan>(sw::serial_world(), 1, false, 2);  // each dp rank one row
  if (world.size() == 4) {
    INFO("dp 2 x tp 2, ZeRO-1");
    check_same(train<models::llama_plan<true>>(world, 2, true), serial_rows);
    INFO("FSDP dp 2 x tp 2 (SP)");
    check_same(train_fsdp<models::llama_plan<true>>(world, 2), serial_rows);
  } else {
    INFO("FSDP dp 2");
    check_same(train_fsdp<sw::serial_plan>(world, 1), serial_rows);
    INFO("pp 2, 2 microbatches");
    check_stage(train_pipeline(world), serial_rows);
  }
}

/// Ranks out of range and targets that match nothing are refused by name.
inline void check_refusals() {
  models::Llama<double> model(llama_packed_cases::config());
  auto config = lora();
  config.rank = 0;
  CHECK_THROWS_WITH_AS(sw::add_lora(model, config),
                       doctest::Contains("shardwise::add_lora: rank 0 for the Linear at \"layers.*.attention.wq\""),
                       sw::error);
  {
    models::Llama<double> sharded_model(llama_packed_cases::config());
    auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
    auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(sharded_model, dp);
    CHECK_THROWS_WITH_AS(sw::add_lora(sharded_model, lora()),
                         doctest::Contains("is under sw::fully_shard, which sharded its parameters as they were; add "
                                           "adapters before fully_shard"),
                         sw::error);
  }
  config.rank = 33;
  CHECK_THROWS_WITH_AS(sw::add_lora(model, config), doctest::Contains("give a rank from 1 to 32"), sw::error);
  config = lora();
  config.target_modules.push_back("layers.*.atention.wq");
  CHECK_THROWS_WITH_AS(sw::add_lora(model, config),
                       "shardwise::add_lora: the target \"layers.*.atention.wq\" matches no Linear of the model; "
                       "targets match layer names such as \"layers.0.attention.wq\"",
                       sw::error);
}

}  // namespace llama_lora_cases
