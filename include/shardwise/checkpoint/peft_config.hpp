#pragma once
// What of peft's adapter files needs no model type (checkpoint/peft.hpp has the rest): adapter_config.json read
// and written, peft's tensor names, the checks of a load. Compiled once for every model a program holds.
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/tensor_mapping.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/core/read_file.hpp"
#include "shardwise/nn/training/lora.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
#include <nlohmann/json.hpp>

#include "shardwise/core/bounded_json.hpp"
#endif

namespace shardwise {

/// shardwise's parameter name -> the base model's in its transformers checkpoint ("layers.0.attention.wq.weight"
/// -> "model.layers.0.self_attn.q_proj.weight": sw::transformers_llama_name); empty: shardwise's own names.
using parameter_names = std::function<std::string(std::string const&)>;

namespace detail {

inline constexpr std::string_view peft_weights_file = "adapter_model.safetensors";
inline constexpr std::string_view peft_config_file = "adapter_config.json";
inline constexpr std::size_t max_peft_rank = 65536, max_peft_targets = 4096;

/// adapter_config.json as read: the LoRA it describes, and whether its target_modules is peft's "all-linear".
struct peft_file_config {
  LoraConfig lora;
  bool all_linear = false;
};

/// Whether a parameter is an adapter's ("layers.0.attention.wq.lora_A.weight").
inline bool is_adapter_tensor(std::string_view name) {
  return name.ends_with(".lora_A.weight") || name.ends_with(".lora_B.weight");
}

/// The module peft names a layer by: its weight's name under `names`, less ".weight".
inline std::string peft_module_name(std::string const& path, parameter_names const& names) {
  if (!names) return path;
  std::string weight = names(path + ".weight");
  if (weight.ends_with(".weight")) weight.resize(weight.size() - 7);
  return weight;
}

/// The adapters' names in peft's files ("base_model.model.<module>.lora_A.weight"); other tensors have none.
inline checkpoint_mapping peft_mapping(parameter_names const& names) {
  return [names](std::string const& name) -> std::optional<tensor_source> {
    if (!is_adapter_tensor(name)) return std::nullopt;
    std::size_t const at = name.rfind(".lora_");
    return tensor_source{"base_model.model." + peft_module_name(name.substr(0, at), names) + name.substr(at)};
  };
}

/// adapter_config.json as peft's LoraConfig.save_pretrained writes it, for `config` on modules `targets`.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string peft_config_text(LoraConfig const& config,
                                                               std::vector<std::string> const& targets,
                                                               std::string const& base_model);
/// Reads the text of adapter_config.json (`label` names it in errors): a LoRA shardwise computes, or refused
/// naming the field.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY peft_file_config peft_config_from_json(std::string_view text,
                                                                         std::string const& label);

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string peft_config_text(LoraConfig const& config,
                                                               std::vector<std::string> const& targets,
                                                               std::string const& base_model) {
  nlohmann::json j = {{"peft_type", "LORA"},
                      {"task_type", "CAUSAL_LM"},
                      {"r", config.rank},
                      {"lora_alpha", config.alpha},
                      {"lora_dropout", 0.0},
                      {"target_modules", targets},
                      {"use_rslora", config.use_rslora},
                      {"bias", "none"},
                      {"fan_in_fan_out", false},
                      {"use_dora", false},
                      {"init_lora_weights", true},
                      {"inference_mode", true},
                      {"modules_to_save", nullptr},
                      {"layers_to_transform", nullptr},
                      {"layers_pattern", nullptr},
                      {"rank_pattern", nlohmann::json::object()},
                      {"alpha_pattern", nlohmann::json::object()}};
  j["base_model_name_or_path"] = base_model.empty() ? nlohmann::json(nullptr) : nlohmann::json(base_model);
  return j.dump(2) + "\n";
}

SHARDWISE_DETAIL_CHECKPOINT_ENTRY peft_file_config peft_config_from_json(std::string_view text,
                                                                         std::string const& label) {
  using nlohmann::json;
  auto const bad = [&](auto const&... parts) { fail("shardwise::load_lora: \"", label, "\" ", parts...); };
  json const root = parse_bounded_json(
      text, max_json_depth,
      [&](std::size_t depth) { bad("nests JSON ", depth, " deep; give peft's adapter_config.json"); },
      [&](std::string const& reason) { bad("is not valid JSON (", reason, "); give peft's adapter_config.json"); });
  if (!root.is_object()) bad("is not a JSON object; give peft's adapter_config.json");
  auto const field = [&](char const* name) { return root.contains(name) ? root[name] : json(nullptr); };
  if (json const type = field("peft_type"); !type.is_null() && type != "LORA")
    bad("has \"peft_type\": ", type.dump(), "; shardwise loads LoRA adapters (\"LORA\")");
  peft_file_config out;
  json const r = field("r");
  if (!r.is_number_integer() || r.get<std::int64_t>() < 1 || r.get<std::int64_t>() > std::int64_t(max_peft_rank))
    bad("has \"r\": ", r.dump(), "; give the adapter's rank, from 1 to ", max_peft_rank);
  out.lora.rank = r.get<std::size_t>();
  json const alpha = field("lora_alpha");
  if (!alpha.is_number() || !std::isfinite(alpha.get<double>()))
    bad("has \"lora_alpha\": ", alpha.dump(), "; give a finite number");
  out.lora.alpha = alpha.get<double>();
  if (json const rs = field("use_rslora"); !rs.is_null() && !rs.is_boolean())
    bad("has \"use_rslora\": ", rs.dump(), "; give true or false");
  out.lora.use_rslora = field("use_rslora") == true;
  json const targets = field("target_modules");
  if (targets == "all-linear") {
    out.all_linear = true;
  } else if (targets.is_array() && !targets.empty() && targets.size() <= max_peft_targets) {
    for (json const& t : targets) {
      if (!t.is_string() || t.get<std::string>().empty())
        bad("has \"target_modules\" entry ", t.dump(), "; give module names");
      out.lora.target_modules.push_back(t.get<std::string>());
    }
  } else {
    bad("has \"target_modules\": ", targets.dump().substr(0, 200),
        "; give a list of module names (\"q_proj\", or whole names), from 1 to ", max_peft_targets,
        ", or \"all-linear\" (shardwise does not match regular expressions)");
  }
  struct unsupported {
    char const* name;
    bool (*present)(json const&);
    char const* what;
  };
  static constexpr unsupported refused[] = {
      {"use_dora", [](json const& v) { return v == true; }, "DoRA"},
      {"fan_in_fan_out", [](json const& v) { return v == true; }, "weights stored [in, out] (Conv1D)"},
      {"lora_bias", [](json const& v) { return v == true; }, "a bias on lora_B"},
      {"bias", [](json const& v) { return !v.is_null() && v != "none"; }, "trained biases"},
      {"modules_to_save", [](json const& v) { return !v.is_null() && !v.empty(); }, "whole modules saved beside"},
      {"rank_pattern", [](json const& v) { return !v.is_null() && !v.empty(); }, "a rank per layer"},
      {"alpha_pattern", [](json const& v) { return !v.is_null() && !v.empty(); }, "an alpha per layer"},
      {"layers_to_transform", [](json const& v) { return !v.is_null(); }, "a choice of layers by index"},
      {"exclude_modules", [](json const& v) { return !v.is_null() && !v.empty(); }, "excluded modules"},
      {"target_parameters", [](json const& v) { return !v.is_null() && !v.empty(); }, "adapters on parameters"},
      {"trainable_token_indices", [](json const& v) { return !v.is_null(); }, "trainable tokens"},
      {"layer_replication", [](json const& v) { return !v.is_null(); }, "replicated layers"},
      {"use_qalora", [](json const& v) { return v == true; }, "QALoRA's pooled input"},
      {"alora_invocation_tokens", [](json const& v) { return !v.is_null(); }, "activated LoRA (aLoRA)"},
      {"arrow_config", [](json const& v) { return !v.is_null(); }, "Arrow's routing between adapters"}};
  for (auto const& u : refused)
    if (u.present(field(u.name)))
      bad("has \"", u.name, "\": ", field(u.name).dump().substr(0, 200), ", which asks for ", u.what,
          "; shardwise's LoRA does not compute it: save the adapter without it");
  return out;
}

#endif

/// Reads folder/adapter_config.json.
inline peft_file_config read_peft_config(std::filesystem::path const& folder) {
  std::string const label = (folder / peft_config_file).string();
  return peft_config_from_json(read_regular_file(label, "shardwise::load_lora",
                                                 "give the folder peft's "
                                                 "save_pretrained (or sw::save_lora) wrote"),
                               label);
}

/// Whether `module` is one the config's target_modules picks (as peft matches a list: the whole name, or its
/// last parts after a dot; "all-linear": every Linear but the output's); marks the entries that pick it.
inline bool peft_targets(peft_file_config const& file, std::string const& module, std::vector<bool>& used) {
  if (file.all_linear) {
    bool const output = module == "lm_head" || module == "output";
    used[0] = used[0] || !output;
    return !output;
  }
  bool target = false;
  for (std::size_t i = 0; i < file.lora.target_modules.size(); ++i) {
    std::string const& key = file.lora.target_modules[i];
    if (module == key ||
        (module.size() > key.size() && module.ends_with(key) && module[module.size() - key.size() - 1] == '.'))
      target = used[i] = true;
  }
  return target;
}

/// A target that picks no Linear of the model is refused, as peft refuses it.
inline void check_peft_targets_used(peft_file_config const& file, std::vector<bool> const& used,
                                    std::filesystem::path const& folder) {
  for (std::size_t i = 0; i < used.size(); ++i)
    if (!used[i])
      fail("shardwise::load_lora: \"", (folder / peft_config_file).string(), "\": \"target_modules\" entry \"",
           file.all_linear ? std::string("all-linear") : file.lora.target_modules[i],
           "\" picks no Linear of the model; load the adapter into the model it was trained on (and give "
           "sw::load_lora that model's names, such as sw::transformers_llama_name)");
}

/// Every lora_A in the file has r rows and every lora_B r columns: an adapter of another rank is refused
/// naming "r" before anything is read.
inline void check_peft_weights(std::filesystem::path const& folder, std::size_t rank) {
  safetensors_file const file((folder / peft_weights_file).string());
  for (tensor_info const& t : file.tensors()) {
    bool const a = t.name.ends_with(".lora_A.weight"), b = t.name.ends_with(".lora_B.weight");
    if ((a || b) && (t.shape.size() != 2 || t.shape[a ? 0 : 1] != rank))
      fail("shardwise::load_lora: \"", file.path(), "\": tensor \"", t.name, "\" has shape ", shape_text(t.shape),
           ", not that of an adapter of \"r\": ", rank,
           " (adapter_config.json); the two files are of different "
           "adapters: save them again together");
  }
}

/// After the adapters' load: an adapter the file lacks, or a tensor of the file no adapter read, is refused.
inline void check_peft_load(load_report const& report, std::filesystem::path const& folder) {
  std::string const file = (folder / peft_weights_file).string();
  for (std::string const& name : report.missing)
    if (is_adapter_tensor(name))
      fail("shardwise::load_lora: \"", file, "\" has no tensor for the model's adapter \"", name,
           "\"; the adapter was trained on another model, or its config names modules its file does not hold");
  for (std::string const& name : report.unexpected)
    fail("shardwise::load_lora: \"", file, "\": tensor \"", name, "\" is no adapter of the model (",
         "adapter_config.json's target_modules does not pick its module, or the model has no such module); load the "
         "adapter into the model it was trained on");
}

}  // namespace detail
}  // namespace shardwise
