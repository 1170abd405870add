#pragma once
// Which model a transformers config.json describes, for the planner: Llama, Qwen2 (Llama's block with q, k and v
// biases), Qwen3 (q and k norms, heads of head_dim), Mistral (Llama's block with a sliding window of keys per query)
// and GPT-2, each as a planner::model_description; `shardwise plan` reads its CONFIG.json with planner::read_model.
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

#include "shardwise/core/read_file.hpp"
#include "shardwise/models/gpt2_config_json.hpp"
#include "shardwise/models/llama_config_fields.hpp"
#include "shardwise/models/llama_config_json.hpp"
#include "shardwise/planner/gpt2.hpp"
#include "shardwise/planner/llama.hpp"

namespace shardwise::planner {

/// The model_types read_model plans.
inline constexpr char const* planned_model_types = "llama, qwen2, qwen3, mistral and gpt2";

/// The planner's description of the model whose transformers config.json is the text `text` (`source` names it
/// in errors), by its model_type: "llama"; "qwen2" (q/k/v biases; the window of "sliding_window" when
/// "use_sliding_window" is true and "max_window_layers" is 0, so that every layer has it); "qwen3" (q and k norms,
/// its head_dim, attention_bias; its config read as models::llama_config_from_json reads it to run); "mistral"
/// ("sliding_window", or none when null); "gpt2".
/// Throws naming the model_type for any other, and the field for a bad one.
inline model_description model_from_json(std::string const& text, std::string const& source) {
  constexpr char const* who = "shardwise::planner::read_model";
  nlohmann::json const root = models::detail::config_root(text, source, "read_model");
  auto const type = root.find("model_type");
  std::string const kind = type != root.end() && type->is_string() ? type->get<std::string>() : "";
  if (kind == "gpt2") return describe(models::gpt2_config_from_json(text, source));
  if (kind == "qwen3") return describe(models::llama_config_from_json(text, source), "Qwen3");
  if (kind != "llama" && kind != "qwen2" && kind != "mistral")
    shardwise::raise(who, ": ", source, " describes model_type ",
                     type == root.end() ? std::string("(none)") : type->dump(), "; the planner plans ",
                     planned_model_types, " (give the config.json that transformers' save_pretrained wrote)");
  models::LlamaConfig const c = models::detail::llama_fields(root, source);
  if (kind == "llama") return describe(c);
  // Qwen2 windows only the layers from max_window_layers on (transformers' layer_types); the planner's blocks are
  // alike, so it applies the window when every layer has it and plans the full attention (an upper bound) else.
  auto const use_window = root.find("use_sliding_window");
  bool windowed = kind == "mistral";
  auto const first_windowed = root.find("max_window_layers");
  if (kind == "qwen2" && use_window != root.end() && use_window->is_boolean() && *use_window)
    windowed = first_windowed != root.end() && first_windowed->is_number_unsigned() && *first_windowed == 0;
  std::size_t window = 0;
  if (windowed && root.contains("sliding_window") && !root["sliding_window"].is_null())
    window = models::detail::config_count(root, "sliding_window", source, 0, "read_model");
  return describe(c, kind == "qwen2" ? "Qwen2" : "Mistral", kind == "qwen2", window);
}

/// The planner's description of the model of the config.json at `file` (model_from_json).
inline model_description read_model(std::filesystem::path const& file) {
  return model_from_json(shardwise::detail::read_regular_file(file.string(), "shardwise::planner::read_model",
                                                              "give the path of a transformers config.json"),
                         file.string());
}

}  // namespace shardwise::planner
