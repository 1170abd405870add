#pragma once
// A transformers config.json of a Llama model (LlamaForCausalLM's, as save_pretrained writes it) read into
// models::LlamaConfig: the sizes the cost model and `shardwise plan` need. Parsed with nlohmann::json, as the
// checkpoint headers are; every error names the file, the field and the fix.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <limits>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/core/read_file.hpp"
#include "shardwise/models/llama.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
#include <nlohmann/json.hpp>

#include "shardwise/checkpoint/atomic_file.hpp"
#include "shardwise/models/llama_config_fields.hpp"
#else  // JSON is parsed only where the entry points are compiled; the one that returns it needs its name
#include <nlohmann/json_fwd.hpp>
#endif

namespace shardwise::models {

/// Whether llama_config_from_json reads configs of transformers' `model_type`: "llama", "qwen2" (biases on q, k
/// and v; a sliding window on the last layers), "qwen3" (per-head norms on q and k, its own head_dim) and
/// "mistral" (Llama's blocks with a sliding window).
inline bool reads_as_llama(std::string_view model_type) {
  return model_type == "llama" || model_type == "qwen2" || model_type == "qwen3" || model_type == "mistral";
}

/// Whether llama_config_from_json reads configs of transformers' `model_type` as a mixture of experts (a LlamaConfig
/// with `moe`, for models::MoeLlama): "mixtral" (Mistral's attention), "qwen2_moe" (Qwen2's, and a shared expert)
/// and "qwen3_moe" (Qwen3's).
inline bool reads_as_moe_llama(std::string_view model_type) {
  return model_type == "mixtral" || model_type == "qwen2_moe" || model_type == "qwen3_moe";
}

/// The LlamaConfig of a transformers Llama, Qwen2, Qwen3 or Mistral config.json given as text; `source` names it
/// in errors. Reads
/// vocab_size, hidden_size, num_hidden_layers, num_attention_heads, num_key_value_heads (default: the family's),
/// intermediate_size, rms_norm_eps, rope_theta, the rotary scaling (transformers 4's rope_scaling or 5's
/// rope_parameters: "default", "linear", "llama3", "yarn", "dynamic"), tie_word_embeddings, max_position_embeddings (as
/// the sequence), head_dim, the biases (Llama's and Qwen3's attention_bias, Llama's mlp_bias; Qwen2's on q, k and
/// v), Qwen3's q and k norms and the sliding window (Mistral's; Qwen2's and Qwen3's use_sliding_window,
/// max_window_layers; layer_types). Throws, naming the field and the fix, for text that is not JSON, another
/// model_type, a missing or non-positive size, and every field that would change the numbers and is not computed
/// (another hidden_act, attention dropout, a partial rotation, experts, a window on a Llama, other layer types, another
/// rotary scaling): docs/models.md lists them.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY LlamaConfig llama_config_from_json(std::string_view text,
                                                                     std::string_view source = "config.json");
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY LlamaConfig llama_config_from_json(std::string_view text, std::string_view source) {
  nlohmann::json const root = detail::config_root(text, source, "llama_config_from_json");
  auto const type = root.find("model_type");
  if (type != root.end() && !(type->is_string() && (reads_as_llama(type->get<std::string>()) ||
                                                    reads_as_moe_llama(type->get<std::string>()))))
    shardwise::raise("shardwise::models::llama_config_from_json: ", source, " describes model_type ", type->dump(),
                     ", not \"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"mixtral\", \"qwen2_moe\" or "
                     "\"qwen3_moe\"; only those configs are read as a Llama");
  std::string const family = type == root.end() ? "llama" : type->get<std::string>();
  LlamaConfig c = detail::llama_fields(root, source, detail::family_defaults(family));
  if (family == "qwen2") {
    c.attention_bias = true;           // Qwen2's q, k and v always have biases, its o none; it has no such field
  } else if (family == "qwen2_moe") {  // the same, unless qkv_bias says otherwise
    c.attention_bias = !root.contains("qkv_bias") || detail::config_flag(root, "qkv_bias", source);
  } else if (family == "llama" || family == "qwen3" || family == "qwen3_moe") {  // Qwen3's has no mlp_bias
    c.attention_bias = c.attention_output_bias = detail::config_flag(root, "attention_bias", source);
    c.mlp_bias = family == "llama" && detail::config_flag(root, "mlp_bias", source);
    c.qk_norm = family == "qwen3" || family == "qwen3_moe";
  }
  if (reads_as_moe_llama(family)) detail::read_experts(root, source, family, c);
  detail::read_sliding_window(root, source, family, c);
  detail::refuse_unbuilt_llama_fields(root, source, c);
  return c;
}
#endif

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
namespace detail {
/// The rotary scaling as transformers' "rope_scaling" object (null when unscaled).
inline nlohmann::json rope_scaling_json(RopeScaling const& r) {
  if (!r.scaled()) return nullptr;
  if (r.type == rope_type::unsupported)
    shardwise::raise(
        "shardwise::models::llama_config_to_json: the configuration has a rotary scaling shardwise "
        "does not compute, whose parameters it does not keep; write that config.json from the original");
  nlohmann::json j = {{"rope_type", rope_type_name(r.type)}, {"factor", r.factor}};
  if (r.type == rope_type::llama3 || r.type == rope_type::yarn)
    j["original_max_position_embeddings"] = r.original_max_positions;
  if (r.type == rope_type::llama3) j["low_freq_factor"] = r.low_freq_factor, j["high_freq_factor"] = r.high_freq_factor;
  if (r.type == rope_type::yarn) {
    j["beta_fast"] = r.beta_fast, j["beta_slow"] = r.beta_slow, j["truncate"] = r.truncate;
    if (r.attention_factor > 0) j["attention_factor"] = r.attention_factor;
    if (r.mscale != 0) j["mscale"] = r.mscale;
    if (r.mscale_all_dim != 0) j["mscale_all_dim"] = r.mscale_all_dim;
  }
  return j;
}

/// The fields of a LlamaForCausalLM's config.json.
inline nlohmann::json llama_config_json_fields(LlamaConfig const& c) {
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
          {"attention_bias", c.attention_bias},
          {"mlp_bias", c.mlp_bias},
          {"tie_word_embeddings", c.tie_word_embeddings},
          {"rope_scaling", rope_scaling_json(c.rope_scaling)},
          {"head_dim", c.head_dim()}};
}

/// The config.json of a Qwen3ForCausalLM (q and k norms): attention_bias on all four projections or none, no
/// feed-forward biases, its window with use_sliding_window and max_window_layers.
inline nlohmann::json qwen3_config_json(LlamaConfig const& c) {
  if (c.attention_bias != c.attention_output_bias || c.mlp_bias)
    shardwise::raise("shardwise::models::llama_config_to_json: q and k norms (Qwen3's) with attention_bias ",
                     c.attention_bias, ", attention_output_bias ", c.attention_output_bias, " and mlp_bias ",
                     c.mlp_bias,
                     " are not a Qwen3's (biases on all four attention projections or none, none in the "
                     "feed-forward); transformers has no config.json for them");
  nlohmann::json j = llama_config_json_fields(c);
  j["architectures"] = {"Qwen3ForCausalLM"}, j["model_type"] = "qwen3";
  j["use_sliding_window"] = c.sliding_window != 0;
  if (c.sliding_window != 0) j["sliding_window"] = c.sliding_window, j["max_window_layers"] = c.first_window_layer;
  j.erase("mlp_bias");  // not Qwen3's field
  return j;
}
/// The config.json of a mixture of experts: a Qwen3MoeForCausalLM for q and k norms, a Qwen2MoeForCausalLM for a
/// gated shared expert (biases on q, k and v or none), else a MixtralForCausalLM (renormalised top-k, no biases);
/// transformers' routing only (softmax, dropless, unscaled).
inline nlohmann::json moe_config_json(LlamaConfig const& c) {
  MoeConfig const m = c.experts();
  if (m.router != moe_router::softmax || m.groups != 1 || m.routed_scaling_factor != 1 || m.capacity_factor != 0 ||
      c.mlp_bias || (m.shared_expert_hidden != 0 && !m.shared_expert_gated))
    shardwise::raise(
        "shardwise::models::llama_config_to_json: these experts route as no transformers mixture of experts does "
        "(a sigmoid router, groups, a scaling factor, a capacity, biases or an ungated shared expert); "
        "transformers has no config.json for them");
  bool const qwen3 = c.qk_norm, qwen2 = !qwen3 && m.shared_expert_hidden != 0;
  bool const fits = qwen3   ? m.shared_expert_hidden == 0 && c.attention_bias == c.attention_output_bias
                    : qwen2 ? !c.attention_output_bias
                            : m.normalize_top_k && !c.attention_bias && !c.attention_output_bias;
  if (!fits)
    shardwise::raise(
        "shardwise::models::llama_config_to_json: experts with these biases, norms and shared expert "
        "are neither a Mixtral's, a Qwen2-MoE's nor a Qwen3-MoE's; transformers has no config.json for "
        "them");
  if (c.sliding_window != 0 && (qwen2 || qwen3 || c.first_window_layer != 0))
    shardwise::raise(
        "shardwise::models::llama_config_to_json: a sliding window on experts is written for a "
        "Mixtral's (every layer) only");
  nlohmann::json j = llama_config_json_fields(c);
  j.erase("mlp_bias");
  j["router_aux_loss_coef"] = m.router_aux_loss_coef, j["output_router_logits"] = m.router_aux_loss_coef != 0;
  j["num_experts_per_tok"] = m.top_k;
  if (!qwen2 && !qwen3) {
    j["architectures"] = {"MixtralForCausalLM"}, j["model_type"] = "mixtral", j.erase("attention_bias");
    j["num_local_experts"] = m.experts, j["intermediate_size"] = m.expert_hidden, j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = c.sliding_window != 0 ? nlohmann::json(c.sliding_window) : nlohmann::json(nullptr);
    return j;
  }
  j["architectures"] = {qwen3 ? "Qwen3MoeForCausalLM" : "Qwen2MoeForCausalLM"};
  j["model_type"] = qwen3 ? "qwen3_moe" : "qwen2_moe";
  j["num_experts"] = m.experts, j["moe_intermediate_size"] = m.expert_hidden, j["norm_topk_prob"] = m.normalize_top_k;
  j["decoder_sparse_step"] = 1, j["mlp_only_layers"] = nlohmann::json::array(), j["use_sliding_window"] = false;
  if (qwen2) {
    j["shared_expert_intermediate_size"] = m.shared_expert_hidden, j["qkv_bias"] = c.attention_bias;
    j.erase("attention_bias");
  }
  return j;
}
}  // namespace detail
#endif

/// The transformers config.json of a model with configuration `c` (what save_pretrained writes for it, and what
/// llama_config_from_json reads back): with experts, a Mixtral, Qwen2-MoE or Qwen3-MoE one; a Qwen3ForCausalLM for q
/// and k norms, a Qwen2ForCausalLM when q, k and v have biases and o none (its sliding window, if any, with
/// use_sliding_window and max_window_layers), a MistralForCausalLM for no biases and a window on every layer, else a
/// LlamaForCausalLM (attention_bias on all four projections, or none; mlp_bias); SiLU, max_position_embeddings =
/// c.sequence, the rotary scaling as "rope_scaling" (which transformers 4 and 5 read). Throws for biases neither family
/// has, and for a window no family with those biases has.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY nlohmann::json llama_config_to_json(LlamaConfig const& c);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY nlohmann::json llama_config_to_json(LlamaConfig const& c) {
  if (c.moe) return detail::moe_config_json(c);
  if (c.qk_norm) return detail::qwen3_config_json(c);
  bool const qwen2 = c.attention_bias && !c.attention_output_bias && !c.mlp_bias;
  bool const mistral = !qwen2 && c.sliding_window != 0 && c.first_window_layer == 0 && !c.attention_bias &&
                       !c.attention_output_bias && !c.mlp_bias;
  if (c.sliding_window != 0 && !qwen2 && !mistral)
    shardwise::raise("shardwise::models::llama_config_to_json: a sliding window of ", c.sliding_window, " from layer ",
                     c.first_window_layer,
                     " with these biases is neither a Qwen2's (biases on q, k and v) nor a Mistral's (no biases, "
                     "every layer); transformers has no config.json for it");
  if (!qwen2 && c.attention_bias != c.attention_output_bias) {
    auto const text = [](bool b) { return b ? "true" : "false"; };
    shardwise::raise("shardwise::models::llama_config_to_json: attention_bias ", text(c.attention_bias),
                     ", attention_output_bias ", text(c.attention_output_bias), " and mlp_bias ", text(c.mlp_bias),
                     " are neither a Llama's (biases on all four attention projections or none) nor a Qwen2's (on "
                     "q, k and v only, none in the feed-forward); transformers has no config.json for them");
  }
  nlohmann::json j = detail::llama_config_json_fields(c);
  if (qwen2) {
    j["architectures"] = {"Qwen2ForCausalLM"}, j["model_type"] = "qwen2";
    j["use_sliding_window"] = c.sliding_window != 0;
    if (c.sliding_window != 0) j["sliding_window"] = c.sliding_window, j["max_window_layers"] = c.first_window_layer;
    j.erase("attention_bias"), j.erase("mlp_bias");  // not Qwen2's fields
  } else if (mistral) {
    j["architectures"] = {"MistralForCausalLM"}, j["model_type"] = "mistral", j["sliding_window"] = c.sliding_window;
    j.erase("attention_bias"), j.erase("mlp_bias");  // not Mistral's fields
  }
  return j;
}
#endif

/// The LlamaConfig of the config.json at `file` (llama_config_from_json); throws naming the file when it cannot
/// be read.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY LlamaConfig read_llama_config(std::filesystem::path const& file);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY LlamaConfig read_llama_config(std::filesystem::path const& file) {
  std::string const text = shardwise::detail::read_regular_file(file.string(), "shardwise::models::read_llama_config",
                                                                "give the path of a transformers config.json");
  return llama_config_from_json(text, file.string());
}
#endif

/// Writes `c` as the config.json at `file` (llama_config_to_json, indented as save_pretrained indents it),
/// replacing the file atomically. With it, a program that writes a config need not include nlohmann/json.hpp.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void write_llama_config(LlamaConfig const& c, std::filesystem::path const& file);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void write_llama_config(LlamaConfig const& c, std::filesystem::path const& file) {
  std::string const text = llama_config_to_json(c).dump(2) + "\n";
  std::span<std::byte const> const pieces[] = {std::as_bytes(std::span(text.data(), text.size()))};
  shardwise::detail::write_file_atomically(file, pieces);
}
#endif

}  // namespace shardwise::models
