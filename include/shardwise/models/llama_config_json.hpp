#pragma once
// A transformers config.json of a Llama model (LlamaForCausalLM's, as save_pretrained writes it) read into
// models::LlamaConfig: the sizes the cost model and `shardwise plan` need. Parsed with nlohmann::json, as the
// checkpoint headers are; every error names the file, the field and the fix.
#include <cstddef>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "shardwise/core/bounded_json.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/core/read_file.hpp"
#include "shardwise/models/llama.hpp"

namespace shardwise::models {

namespace detail {

/// `field` of `root` as a positive whole number, or `fallback` when absent and `fallback` is not 0; `who` (the
/// reading function) and `source` (the file) name it in errors.
inline std::size_t config_count(nlohmann::json const& root, char const* field, std::string_view source,
                                std::size_t fallback = 0, char const* who = "llama_config_from_json") {
  auto const found = root.find(field);
  if (found == root.end() || found->is_null()) {
    if (fallback != 0) return fallback;
    shardwise::raise("shardwise::models::", who, ": ", source, " has no \"", field,
                     "\"; give the config.json that transformers' save_pretrained wrote for this model");
  }
  if (!found->is_number_unsigned() || found->get<std::size_t>() == 0)
    shardwise::raise("shardwise::models::", who, ": \"", field, "\" in ", source, " is ", found->dump(),
                     "; it must be a positive whole number");
  return found->get<std::size_t>();
}

/// `field` of `root` as a number, or `fallback` when absent.
inline double config_real(nlohmann::json const& root, char const* field, std::string_view source, double fallback,
                          char const* who = "llama_config_from_json") {
  auto const found = root.find(field);
  if (found == root.end() || found->is_null()) return fallback;
  if (!found->is_number())
    shardwise::raise("shardwise::models::", who, ": \"", field, "\" in ", source, " is ", found->dump(),
                     "; it must be a number");
  return found->get<double>();
}

/// The JSON object of a transformers config.json given as text, bounded in depth; `who` and `source` name it in
/// errors.
inline nlohmann::json config_root(std::string_view text, std::string_view source, char const* who) {
  nlohmann::json root = shardwise::detail::parse_bounded_json(
      text, shardwise::detail::max_json_depth,
      [&](std::size_t depth) {
        shardwise::raise("shardwise::models::", who, ": ", source, " nests JSON ", depth,
                         " deep; give the config.json that transformers' save_pretrained wrote");
      },
      [&](std::string const& reason) {
        shardwise::raise("shardwise::models::", who, ": ", source, " is not valid JSON (", reason,
                         "); give the config.json that transformers' save_pretrained wrote");
      });
  if (!root.is_object())
    shardwise::raise("shardwise::models::", who, ": ", source,
                     " is not a JSON object; give the config.json that transformers' save_pretrained wrote");
  return root;
}

/// The rotary embedding's base ("rope_theta", or transformers 5's "rope_parameters": {"rope_theta": ...}) into
/// c.rope_theta, and a scaling of it (rope_type "llama3", "linear", "yarn", ..., or transformers 4's
/// "rope_scaling") into c.rope_scaled: the planner needs no more, and the model refuses it.
inline void read_rope(nlohmann::json const& root, std::string_view source, LlamaConfig& c) {
  c.rope_theta = config_real(root, "rope_theta", source, 10000.0);
  if (auto scaling = root.find("rope_scaling"); scaling != root.end() && !scaling->is_null()) c.rope_scaled = true;
  auto const parameters = root.find("rope_parameters");
  if (parameters == root.end() || parameters->is_null()) return;
  if (!parameters->is_object())
    shardwise::raise("shardwise::models::llama_config_from_json: \"rope_parameters\" in ", source, " is ",
                     parameters->dump(), "; it must be an object");
  c.rope_theta = config_real(*parameters, "rope_theta", source, c.rope_theta);
  if (auto type = parameters->find("rope_type"); type != parameters->end() && *type != "default") c.rope_scaled = true;
}

/// The Llama fields of a config.json's object (Llama's, or Qwen2's and Mistral's, which share them).
inline LlamaConfig llama_fields(nlohmann::json const& root, std::string_view source) {
  LlamaConfig c;
  c.vocabulary = detail::config_count(root, "vocab_size", source);
  c.dim = detail::config_count(root, "hidden_size", source);
  c.layers = detail::config_count(root, "num_hidden_layers", source);
  c.heads = detail::config_count(root, "num_attention_heads", source);
  c.kv_heads = detail::config_count(root, "num_key_value_heads", source, c.heads);
  c.hidden = detail::config_count(root, "intermediate_size", source);
  c.sequence = detail::config_count(root, "max_position_embeddings", source, 2048);
  c.norm_eps = detail::config_real(root, "rms_norm_eps", source, 1e-6);
  detail::read_rope(root, source, c);
  if (auto tie = root.find("tie_word_embeddings"); tie != root.end() && tie->is_boolean()) c.tie_word_embeddings = *tie;
  c.check();
  if (root.contains("head_dim") && !root["head_dim"].is_null() &&
      detail::config_count(root, "head_dim", source) * c.heads != c.dim)
    shardwise::raise("shardwise::models::llama_config_from_json: \"head_dim\" in ", source,
                     " is not hidden_size / num_attention_heads; shardwise's Llama has heads of that width only");
  return c;
}
}  // namespace detail

/// The LlamaConfig of a transformers Llama config.json given as text; `source` names it in errors. Reads
/// vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: the heads),
/// intermediate_size, rms_norm_eps, rope_theta (or transformers 5's rope_parameters.rope_theta),
/// tie_word_embeddings and max_position_embeddings (as the sequence); a scaled rotary embedding sets
/// rope_scaled (models::Llama refuses it). Throws, naming the field, for text that is not JSON, another model_type, a
/// missing or non-positive size, or a head_dim other than hidden_size / num_attention_heads.
inline LlamaConfig llama_config_from_json(std::string_view text, std::string_view source = "config.json") {
  nlohmann::json const root = detail::config_root(text, source, "llama_config_from_json");
  if (auto type = root.find("model_type"); type != root.end() && *type != "llama")
    shardwise::raise("shardwise::models::llama_config_from_json: ", source, " describes model_type ", type->dump(),
                     ", not \"llama\"; only Llama configs are read");
  return detail::llama_fields(root, source);
}

/// The transformers config.json of a LlamaForCausalLM with configuration `c` (what save_pretrained writes for
/// it, and what llama_config_from_json reads back): SiLU, no biases, max_position_embeddings = c.sequence.
/// Throws for a scaled rotary embedding (rope_scaled), whose parameters it does not have.
inline nlohmann::json llama_config_to_json(LlamaConfig const& c) {
  if (c.rope_scaled)
    shardwise::raise(
        "shardwise::models::llama_config_to_json: the configuration has a scaled rotary embedding, "
        "whose parameters LlamaConfig does not keep; write that config.json from the original");
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", c.vocabulary},
          {"hidden_size", c.dim},
          {"num_hidden_layers", c.layers},
          {"num_attention_heads", c.heads},
          {"num_key_value_heads", c.kv_heads},
          {"intermediate_size", c.hidden},
          {"max_position_embeddings", c.sequence},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"hidden_act", "silu"},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"tie_word_embeddings", c.tie_word_embeddings}};
}

/// The LlamaConfig of the config.json at `file` (llama_config_from_json); throws naming the file when it cannot
/// be read.
inline LlamaConfig read_llama_config(std::filesystem::path const& file) {
  std::string const text = shardwise::detail::read_regular_file(file.string(), "shardwise::models::read_llama_config",
                                                                "give the path of a transformers config.json");
  return llama_config_from_json(text, file.string());
}

}  // namespace shardwise::models
