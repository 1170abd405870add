#pragma once
// LoRA adapters in peft's files: adapter_model.safetensors (the adapters whole, under peft's names
// "base_model.model.<module>.lora_A.weight") and adapter_config.json (r, lora_alpha, target_modules, ...), which
// PeftModel.from_pretrained loads and PeftModel.save_pretrained writes; from any tp layout, into any.
//
//   sw::save_lora(model, tp, "adapter", lora, sw::transformers_llama_name);   // collective over tp
//   sw::LoraConfig const read = sw::load_lora(model, tp, "adapter", sw::transformers_llama_name);
//
// A save writes each rank's pieces as a sharded checkpoint inside the folder, which the leader consolidates
// under peft's names (the same path, and checks, as `shardwise consolidate`) and then removes.
#include <cstddef>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/consolidate.hpp"
#include "shardwise/checkpoint/optimizer_state.hpp"
#include "shardwise/checkpoint/peft_config.hpp"
#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/checkpoint/sharded.hpp"
#include "shardwise/nn/training/lora.hpp"

namespace shardwise {

namespace detail {

/// The model's tensors but the adapters' left out: what a save of the adapters writes.
inline model_tensors adapter_tensors_only(model_tensors all) {
  all.walk = [inner = std::move(all.walk)](int size, int rank, bool materialize, model_tensors::visitor const& fn) {
    inner(size, rank, materialize, [&](tensor_layout const& t, tensor_values const& v) {
      if (is_adapter_tensor(t.name)) fn(t, v);
    });
  };
  all.config.reset(), all.check_index = {};
  return all;
}

/// Collective over the group: every rank writes its adapters' pieces into a sharded checkpoint inside `folder`;
/// the leader consolidates it into adapter_model.safetensors under peft's names, writes adapter_config.json and
/// removes the pieces. A failure anywhere is raised on every rank.
inline void write_peft_folder(model_tensors const& adapters, save_group const& group,
                              std::filesystem::path const& folder, std::string const& config_text,
                              parameter_names const& names) {
  namespace fs = std::filesystem;
  fs::path const pieces = folder / ".shardwise_adapter_pieces";
  std::string error;
  if (group.leader()) try {
      fs::create_directories(folder);
    } catch (std::exception const& e) {
      error = e.what();
    }
  group.agree(error, "creating the adapter's folder", folder);
  save_sharded_stage(adapters, group, pieces, 0, {}, {});
  if (group.leader()) try {
      (void)consolidate(pieces, folder / peft_weights_file, {.mapping = peft_mapping(names), .progress = {}});
      std::span<std::byte const> const text(reinterpret_cast<std::byte const*>(config_text.data()), config_text.size());
      write_file_atomically(folder / peft_config_file, std::span(&text, 1));
      fs::remove_all(pieces);
      fs::remove_all(previous_checkpoint_dir(pieces));
    } catch (std::exception const& e) {
      error = e.what();
    }
  group.agree(error, "writing adapter_model.safetensors", folder);
}

/// The target_modules a save writes: the module names' last parts ("q_proj") when the adapted modules are exactly
/// the Linears with those last parts, as peft's users write them; else every adapted module by its full name.
inline std::vector<std::string> peft_target_modules(std::vector<std::pair<std::string, bool>> const& linears) {
  auto const last_part = [](std::string const& m) { return m.substr(m.rfind('.') + 1); };
  std::set<std::string> parts, adapted;
  for (auto const& [module, has_adapter] : linears)
    if (has_adapter) parts.insert(last_part(module)), adapted.insert(module);
  for (auto const& [module, has_adapter] : linears)
    if (!has_adapter && parts.count(last_part(module))) return {adapted.begin(), adapted.end()};
  return {parts.begin(), parts.end()};
}

/// The Linears of `model` by peft's module name, each with whether it has an adapter; an adapter whose rank or
/// scale is not `config`'s is refused by `who`.
template <module Model>
std::vector<std::pair<std::string, bool>> adapted_linears(Model& model, LoraConfig const& config,
                                                          parameter_names const& names, std::string_view who,
                                                          std::string_view fix) {
  std::vector<std::pair<std::string, bool>> linears;
  for_each_named_layer(model, [&](auto& l, std::string const& path) {
    if constexpr (requires { l.lora_shape(); }) {
      auto const [rank, scale] = l.lora_shape();
      linears.emplace_back(peft_module_name(path, names), rank != 0);
      using T = typename std::remove_cvref_t<decltype(l.weight)>::Scalar;
      if (rank != 0 && (rank != config.rank || scale != static_cast<T>(lora_scale(config))))
        fail("shardwise::", who, ": the adapter of the Linear at \"", path, "\" has rank ", rank, " and scale ", scale,
             ", but the LoraConfig has r ", config.rank, " and scale ", lora_scale(config), " (lora_alpha ",
             config.alpha, config.use_rslora ? ", use_rslora" : "", "); ", fix);
    }
  });
  return linears;
}

}  // namespace detail

/// Saves the model's LoRA adapters (sw::add_lora, with `config`) as peft's save_pretrained does, in `folder`:
/// adapter_model.safetensors holds each adapter whole under "base_model.model.<module>.lora_A.weight" (and
/// lora_B), the module named by `names` (shardwise's parameter name -> transformers': sw::transformers_llama_name;
/// shardwise's own names when empty), and adapter_config.json says r, lora_alpha, use_rslora and target_modules
/// (the modules' last parts, "q_proj", when they pick exactly the adapted ones), with `base_model` as
/// base_model_name_or_path. Collective over tp: every tp rank calls it (under data parallelism, the ranks of one
/// replica: see the overload with dp); each file is replaced atomically. A model without adapters, or one whose
/// adapters are not of `config`, is refused.
template <module Model, class TpMesh>
void save_lora(Model& model, TpMesh const& tp, std::filesystem::path const& folder, LoraConfig const& config,
               parameter_names const& names = {}, std::string const& base_model = {}) {
  auto const linears =
      detail::adapted_linears(model, config, names, "save_lora", "give the LoraConfig the adapters were added with");
  auto const targets = detail::peft_target_modules(linears);
  if (targets.empty())
    detail::fail(
        "shardwise::save_lora: the model has no LoRA adapter to save; add them with sw::add_lora or "
        "sw::load_lora first");
  auto group = detail::save_group_over(tp);
  group.tp_size = tp.size(), group.tp_rank = tp.rank();
  detail::write_peft_folder(detail::adapter_tensors_only(detail::tensors_of(model)), group, folder,
                            detail::peft_config_text(config, targets, base_model), names);
}

/// save_lora from a data-parallel run: dp rank 0's replica writes (its ranks over tp), and a failure is raised on
/// every rank of tp x dp. Every rank calls it.
template <module Model, class TpMesh, class DpMesh>
void save_lora(Model& model, TpMesh const& tp, DpMesh const& dp, std::filesystem::path const& folder,
               LoraConfig const& config, parameter_names const& names = {}, std::string const& base_model = {}) {
  detail::on_dp_rank0(dp, folder, "saving the LoRA adapters",
                      [&] { save_lora(model, tp, folder, config, names, base_model); });
}

/// Loads a LoRA adapter that peft (PeftModel.save_pretrained) or sw::save_lora wrote in `folder` into a
/// parallelized model of any tp size, as PeftModel.from_pretrained does: every Linear whose module name (by
/// `names`, as save_lora) adapter_config.json's target_modules picks gets an adapter of its r and scale (one it
/// has already must have them), every other parameter is frozen, and each rank reads only its pieces of the
/// adapters. Collective over tp. Refused, naming the field or tensor: a config peft's LoRA has but shardwise does
/// not compute (DoRA, biases, fan_in_fan_out, modules_to_save, per-layer ranks), a target that picks no Linear, an
/// adapter tensor of another rank or shape than the model's, and one the file lacks or has besides. Returns the
/// config read (its target_modules as the file gives them).
template <module Model, class TpMesh>
LoraConfig load_lora(Model& model, TpMesh const& tp, std::filesystem::path const& folder,
                     parameter_names const& names = {}) {
  detail::peft_file_config const file = detail::read_peft_config(folder);
  detail::check_peft_weights(folder, file.lora.rank);
  std::vector<bool> used(file.lora.target_modules.size() + (file.all_linear ? 1 : 0), false);
  detail::for_each_named_layer(model, [&](auto& l, std::string const& path) {
    if constexpr (requires { l.lora_shape(); }) {
      bool const target = detail::peft_targets(file, detail::peft_module_name(path, names), used);
      if (target && l.lora_shape().first == 0) {
        using T = typename std::remove_cvref_t<decltype(l.weight)>::Scalar;
        l.shardwise_add_lora(file.lora.rank, static_cast<T>(lora_scale(file.lora)), 0);
      } else if (!target && l.lora_shape().first != 0) {
        detail::fail("shardwise::load_lora: \"", (folder / detail::peft_config_file).string(), "\": the Linear at \"",
                     path,
                     "\" has an adapter, and the file's \"target_modules\" does not "
                     "pick it; load into a model without adapters, or one adapted as the file says");
      }
    }
  });
  detail::check_peft_targets_used(file, used, folder);
  (void)detail::adapted_linears(model, file.lora, names, "load_lora",
                                "the LoraConfig is adapter_config.json's: load into a model without adapters");
  detail::freeze_all_but_adapters(model);
  load_options options;
  options.strict = false;  // the base's tensors are not in the file: missing, and checked below for adapters only
  detail::check_peft_load(detail::load_mapped(model, tp, folder / detail::peft_weights_file,
                                              detail::peft_mapping(names), options, "load_lora"),
                          folder);
  return file.lora;
}

}  // namespace shardwise
