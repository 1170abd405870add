#pragma once
// Adapters in peft's files (sw::save_lora / sw::load_lora) on the Qwen2-like config of llama_packed_cases, fp64:
// adapters trained 2 steps at tp 2 with SP and saved under transformers' names load at tp 1, 2 (no SP) and 4 with
// the same adapters (exactly) and logits (1e-12); the files hold peft's names and fields; the adapters merged and
// exported as a transformers checkpoint (save_sharded + consolidate under transformers_llama_mapping) load into a
// plain model with the same logits. Bad input, each refused by name: an adapter of another rank or shape, a
// target that picks nothing, a config shardwise does not compute (DoRA), a tensor the file lacks, a save without
// adapters or with another config.
#include <doctest/doctest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <shardwise/checkpoint/peft.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "llama_lora_cases.hpp"
#include "llama_packed_cases.hpp"
#include "support/worlds.hpp"

namespace llama_peft_cases {

namespace sw = shardwise;
namespace fs = std::filesystem;
namespace models = shardwise::models;
using matrix = sw::nn::matrix<double>;

inline fs::path scratch(std::string const& name) {
  return fs::temp_directory_path() / ("shardwise_test_peft_" + std::to_string(::getpid()) + "_" + name);
}

/// What a run leaves to compare: the logits of a fixed batch and every adapter whole, by name.
struct Snapshot {
  matrix logits;
  std::vector<std::string> names;
  std::vector<matrix> adapters;
};

template <class Model, class Tp>
Snapshot snapshot(Model& model, Tp const& tp) {
  std::vector<std::int64_t> ids, targets;
  std::vector<std::size_t> lengths;
  llama_packed_cases::packed_row(3, 0, ids, targets, lengths);
  Snapshot s{llama_packed_cases::whole_logits(tp, model.forward(ids, sw::sequence_lengths(lengths))), {}, {}};
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") != std::string::npos) s.names.push_back(name), s.adapters.push_back(sw::full_tensor(p));
  });
  return s;
}

/// 2 AdamW steps of adapters at tp 2 with SP, then saved in `folder` under transformers' names, and merged and
/// exported in `merged` as a transformers checkpoint; returns the trained model's snapshot.
template <class World>
Snapshot train_and_save(World const& world, fs::path const& folder, fs::path const& merged) {
  auto const c = llama_packed_cases::config();
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::Llama<double, models::llama_plan<true>> model(c);
  sw::parallelize(model, tp);
  sw::add_lora(model, llama_lora_cases::lora());
  llama_lora_cases::fill_b(model);
  sw::AdamW<double> optimizer({.learning_rate = 1e-2});
  for (int step = 0; step < 2; ++step) {
    std::vector<std::int64_t> ids, targets;
    std::vector<std::size_t> lengths;
    llama_packed_cases::packed_row(step, 0, ids, targets, lengths);
    auto const loss = models::llama_loss(tp, model.forward(ids, sw::sequence_lengths(lengths)), targets, c.vocabulary);
    model.backward(loss.dlogits);
    optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
  }
  sw::save_lora(model, tp, folder, llama_lora_cases::lora(), sw::transformers_llama_name, "tests/qwen2-like");
  Snapshot const trained = snapshot(model, tp);
  sw::merge_lora(model);
  sw::save_sharded(model, tp, merged / "sharded", 2);
  if (tp.rank() == 0)
    sw::consolidate(merged / "sharded", merged / "model.safetensors", {.mapping = sw::transformers_llama_mapping()});
  return trained;
}

/// A fresh model at tp = world size with Plan, the adapter loaded from `folder`.
template <class Plan, class World>
Snapshot load_and_run(World const& world, fs::path const& folder) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  models::Llama<double, Plan> model(llama_packed_cases::config());
  sw::parallelize(model, tp);
  sw::LoraConfig const read = sw::load_lora(model, tp, folder, sw::transformers_llama_name);
  CHECK(read.rank == 4);
  CHECK(read.alpha == 8);
  CHECK(read.target_modules == std::vector<std::string>{"k_proj", "o_proj", "q_proj", "v_proj"});
  std::size_t frozen = 0, adapters = 0;
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    bool const adapter = name.find(".lora_") != std::string::npos;
    adapters += adapter ? 1 : 0;
    frozen += !adapter && sw::detail::is_frozen(p) ? 1 : 0;
    if (adapter) CHECK(!sw::detail::is_frozen(p));
  });
  CHECK(adapters == 2 * 4 * 2);
  CHECK(frozen > 0);
  return snapshot(model, tp);
}

inline void check_same(Snapshot const& got, Snapshot const& expected) {
  CHECK(llama_packed_cases::relative_error(got.logits, expected.logits) <= 1e-12);
  REQUIRE(got.names == expected.names);
  for (std::size_t i = 0; i < got.names.size(); ++i) {
    INFO(got.names[i]);
    CHECK(got.adapters[i] == expected.adapters[i]);  // the values saved, bit for bit
  }
}

/// peft's names and fields in the files.
inline void check_files(fs::path const& folder) {
  sw::safetensors_file const weights((folder / "adapter_model.safetensors").string());
  CHECK(weights.tensors().size() == 2 * 4 * 2);
  CHECK(weights.contains("base_model.model.model.layers.1.self_attn.o_proj.lora_B.weight"));
  CHECK(weights.info("base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight").shape ==
        std::vector<std::uint64_t>{4, 32});
  std::ifstream in(folder / "adapter_config.json");
  auto const config = nlohmann::json::parse(in);
  CHECK(config["peft_type"] == "LORA");
  CHECK(config["r"] == 4);
  CHECK(config["lora_alpha"] == 8.0);
  CHECK(config["use_rslora"] == false);
  CHECK(config["target_modules"] == nlohmann::json{"k_proj", "o_proj", "q_proj", "v_proj"});
  CHECK(config["base_model_name_or_path"] == "tests/qwen2-like");
  CHECK(!fs::exists(folder / ".shardwise_adapter_pieces"));
}

/// The merged export loads into a plain model (unsharded) with the adapted model's logits.
inline void check_merged(fs::path const& merged, Snapshot const& trained) {
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<double> base(llama_packed_cases::config());
  sw::load_pretrained(base, tp, merged / "model.safetensors", sw::transformers_llama_mapping());
  CHECK(llama_packed_cases::relative_error(snapshot(base, tp).logits, trained.logits) <= 1e-12);
}

/// Saves at tp 2 (SP), loads at 1, 2 (no SP) and 4, and the merged export.
inline void check_any_layout_to_any() {
  fs::path const folder = scratch("adapter"), merged = scratch("merged");
  Snapshot trained;
  worlds::run_threads(2, [&](auto& world) {
    Snapshot s = train_and_save(world, folder, merged);
    if (world.rank() == 0) trained = std::move(s);
  });
  check_files(folder);
  check_merged(merged, trained);
  check_same(load_and_run<sw::serial_plan>(sw::serial_world(), folder), trained);
  worlds::run_threads(
      2, [&](auto& world) { check_same(load_and_run<models::llama_plan<false>>(world, folder), trained); });
  worlds::run_threads(4,
                      [&](auto& world) { check_same(load_and_run<models::llama_plan<true>>(world, folder), trained); });
  fs::remove_all(merged);
}

/// A copy of the saved adapter with `change` applied to its adapter_config.json.
template <class Change>
fs::path edited(fs::path const& from, std::string const& name, Change const& change) {
  fs::path const to = scratch(name);
  fs::remove_all(to);
  fs::create_directories(to);
  fs::copy_file(from / "adapter_model.safetensors", to / "adapter_model.safetensors");
  std::ifstream in(from / "adapter_config.json");
  auto config = nlohmann::json::parse(in);
  change(config);
  std::ofstream(to / "adapter_config.json") << config.dump(2);
  return to;
}

inline void check_refused(fs::path const& folder, char const* message) {
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<double> model(llama_packed_cases::config());
  CHECK_THROWS_WITH_AS(sw::load_lora(model, tp, folder, sw::transformers_llama_name), doctest::Contains(message),
                       sw::error);
}

/// Each bad input refused by name (the adapter saved by check_any_layout_to_any).
inline void check_refusals() {
  fs::path const folder = scratch("adapter");
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  fs::path const other_rank = edited(folder, "other_rank", [](auto& c) { c["r"] = 8; });
  check_refused(other_rank,
                "tensor \"base_model.model.model.layers.0.self_attn.k_proj.lora_A.weight\" has shape "
                "[4, 32], not that of an adapter of \"r\": 8 (adapter_config.json)");
  fs::path const nothing = edited(folder, "nothing", [](auto& c) { c["target_modules"].push_back("qproj"); });
  check_refused(nothing, "\"target_modules\" entry \"qproj\" picks no Linear of the model");
  fs::path const dora = edited(folder, "dora", [](auto& c) { c["use_dora"] = true; });
  check_refused(dora, "has \"use_dora\": true, which asks for DoRA; shardwise's LoRA does not compute it");
  fs::path const lacking = edited(folder, "lacking", [](auto& c) { c["target_modules"].push_back("gate_proj"); });
  check_refused(lacking, "has no tensor for the model's adapter \"layers.0.feed_forward.w1.lora_A.weight\"");
  {  // the model's own adapters of another rank
    models::Llama<double> model(llama_packed_cases::config());
    auto config = llama_lora_cases::lora();
    config.rank = 2;
    sw::add_lora(model, config);
    CHECK_THROWS_WITH_AS(sw::load_lora(model, tp, folder, sw::transformers_llama_name),
                         doctest::Contains("has rank 2 and scale 4, but the LoraConfig has r 4 and scale 2"),
                         sw::error);
    CHECK_THROWS_WITH_AS(sw::save_lora(model, tp, scratch("unsaved"), llama_lora_cases::lora()),
                         doctest::Contains("give the LoraConfig the adapters were added with"), sw::error);
  }
  {  // an adapter of another shape: a model twice as wide
    auto c = llama_packed_cases::config();
    c.dim = 64, c.heads = 8, c.kv_heads = 4;
    models::Llama<double> wide(c);
    CHECK_THROWS_WITH_AS(sw::load_lora(wide, tp, folder, sw::transformers_llama_name),
                         doctest::Contains("tensor \"layers.0.attention.wq.lora_A.weight\" has shape [4, 64] in the "
                                           "model but [4, 32] in the checkpoint"),
                         sw::error);
  }
  models::Llama<double> plain(llama_packed_cases::config());
  CHECK_THROWS_WITH_AS(sw::save_lora(plain, tp, scratch("unsaved"), llama_lora_cases::lora()),
                       "shardwise::save_lora: the model has no LoRA adapter to save; add them with sw::add_lora or "
                       "sw::load_lora first",
                       sw::error);
  for (auto const& f : {folder, other_rank, nothing, dora, lacking}) fs::remove_all(f);
}

}  // namespace llama_peft_cases
