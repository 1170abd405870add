#pragma once
// Reading a transformers GPT-2 config.json into models::GPT2Config, and which model a config.json describes
// (transformers_model_type), so that a program can load whichever save_pretrained folder it is given.
#include <filesystem>
#include <string>
#include <string_view>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/core/read_file.hpp"
#include "shardwise/models/gpt2.hpp"
#include "shardwise/models/llama_config_json.hpp"

namespace shardwise::models {

/// The GPT2Config of a transformers GPT-2 config.json given as text; `source` names it in errors. Reads
/// vocab_size, n_embd, n_layer, n_head, n_positions (as the sequence: wpe's rows) and layer_norm_epsilon. Throws,
/// naming the field, for text that is not JSON, another model_type, a missing or non-positive size, or what
/// shardwise's GPT-2 does not compute: an activation other than "gelu_new", an n_inner other than 4 n_embd.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY GPT2Config gpt2_config_from_json(std::string_view text,
                                                                   std::string_view source = "config.json");
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY GPT2Config gpt2_config_from_json(std::string_view text, std::string_view source) {
  constexpr char const* who = "gpt2_config_from_json";
  nlohmann::json const root = detail::config_root(text, source, who);
  if (auto type = root.find("model_type"); type != root.end() && *type != "gpt2")
    shardwise::raise("shardwise::models::gpt2_config_from_json: ", source, " describes model_type ", type->dump(),
                     ", not \"gpt2\"; only GPT-2 configs are read");
  GPT2Config c;
  c.vocabulary = detail::config_count(root, "vocab_size", source, 0, who);
  c.dim = detail::config_count(root, "n_embd", source, 0, who);
  c.layers = detail::config_count(root, "n_layer", source, 0, who);
  c.heads = detail::config_count(root, "n_head", source, 0, who);
  c.sequence = detail::config_count(root, "n_positions", source, 0, who);
  c.layer_norm_eps = detail::config_real(root, "layer_norm_epsilon", source, 1e-5, who);
  if (auto act = root.find("activation_function"); act != root.end() && *act != "gelu_new")
    shardwise::raise("shardwise::models::gpt2_config_from_json: ", source, " has activation_function ", act->dump(),
                     "; shardwise's GPT-2 computes \"gelu_new\" only");
  if (detail::config_count(root, "n_inner", source, 4 * c.dim, who) != 4 * c.dim)
    shardwise::raise("shardwise::models::gpt2_config_from_json: \"n_inner\" in ", source,
                     " is not 4 x n_embd; shardwise's GPT-2 has that MLP width only");
  c.check();
  return c;
}
#endif

/// The transformers config.json of a GPT2LMHeadModel with configuration `c` (what save_pretrained writes for it,
/// and what gpt2_config_from_json reads back): no dropout, "gelu_new", the LM head tied to wte.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY nlohmann::json gpt2_config_to_json(GPT2Config const& c);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY nlohmann::json gpt2_config_to_json(GPT2Config const& c) {
  return {{"architectures", {"GPT2LMHeadModel"}},
          {"model_type", "gpt2"},
          {"vocab_size", c.vocabulary},
          {"n_embd", c.dim},
          {"n_layer", c.layers},
          {"n_head", c.heads},
          {"n_positions", c.sequence},
          {"n_inner", nullptr},
          {"layer_norm_epsilon", c.layer_norm_eps},
          {"activation_function", "gelu_new"},
          {"resid_pdrop", 0.0},
          {"embd_pdrop", 0.0},
          {"attn_pdrop", 0.0},
          {"tie_word_embeddings", true}};
}
#endif

/// The GPT2Config of the config.json at `file` (gpt2_config_from_json); throws naming the file when it cannot be
/// read.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY GPT2Config read_gpt2_config(std::filesystem::path const& file);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY GPT2Config read_gpt2_config(std::filesystem::path const& file) {
  std::string const text = shardwise::detail::read_regular_file(file.string(), "shardwise::models::read_gpt2_config",
                                                                "give the path of a transformers config.json");
  return gpt2_config_from_json(text, file.string());
}
#endif

/// The model_type of the transformers config.json at `file` ("llama", "gpt2", ...); throws naming the file when
/// it cannot be read, is not a JSON object, or has no model_type.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string transformers_model_type(std::filesystem::path const& file);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string transformers_model_type(std::filesystem::path const& file) {
  constexpr char const* who = "transformers_model_type";
  std::string const text = shardwise::detail::read_regular_file(
      file.string(), "shardwise::models::transformers_model_type", "give the path of a transformers config.json");
  nlohmann::json const root = detail::config_root(text, file.string(), who);
  auto const type = root.find("model_type");
  if (type == root.end() || !type->is_string())
    shardwise::raise("shardwise::models::transformers_model_type: ", file.string(),
                     " has no \"model_type\" text; give the config.json that transformers' save_pretrained wrote");
  return type->get<std::string>();
}
#endif

}  // namespace shardwise::models
