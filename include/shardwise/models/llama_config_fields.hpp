#pragma once
// The fields of a transformers config.json as models::LlamaConfig reads them, checked one by one: counts, reals,
// the rotary scaling, the sliding window, and the fields that would change the numbers and are refused.
// models/llama_config_json.hpp reads a whole config with them (compiled once with shardwise::separate_checkpoint),
// and the planner reads a config's model with them (planner/models.hpp).
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "shardwise/core/bounded_json.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/models/llama_config.hpp"

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
  if (!found->is_number() || !std::isfinite(found->get<double>()))
    shardwise::raise("shardwise::models::", who, ": \"", field, "\" in ", source, " is ", found->dump(),
                     "; it must be a finite number");
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

/// `field` of `parameters` (a rope scaling's object) as a number; `fallback` when absent or null, and an error
/// naming the scaling and the field when there is no fallback (NaN).
inline double rope_number(nlohmann::json const& parameters, char const* field, std::string_view type,
                          std::string_view source, double fallback) {
  auto const found = parameters.find(field);
  if (found != parameters.end() && !found->is_null()) return config_real(parameters, field, source, fallback);
  if (std::isnan(fallback))
    shardwise::raise("shardwise::models::llama_config_from_json: the ", type, " rotary scaling in ", source,
                     " has no \"", field, "\"; give the config.json that transformers' save_pretrained wrote");
  return fallback;
}

/// The scaling object: a non-empty "rope_scaling" (transformers 4's, which transformers 5 still prefers), else a
/// non-empty "rope_parameters" (transformers 5's); null when neither (the plain rotary embedding). Refuses
/// parameters per layer type (a nested object).
inline nlohmann::json const* rope_object(nlohmann::json const& root, std::string_view source) {
  for (char const* key : {"rope_scaling", "rope_parameters"}) {  // transformers: `rope_scaling or rope_parameters`
    auto const found = root.find(key);
    if (found == root.end() || found->is_null()) continue;
    if (!found->is_object())
      shardwise::raise("shardwise::models::llama_config_from_json: \"", key, "\" in ", source, " is ", found->dump(),
                       "; it must be an object");
    if (found->empty()) continue;
    for (auto const& [name, value] : found->items())
      if (value.is_object() || value.is_array())
        shardwise::raise("shardwise::models::llama_config_from_json: \"", key, "\" in ", source, " holds \"", name,
                         "\": ", value.dump(),
                         "; rotary parameters per layer type are not computed: use a model with "
                         "one rotary embedding for every layer");
    return &*found;
  }
  return nullptr;
}

/// The scaling's parameters, with transformers' defaults (original_max_position_embeddings: the config's
/// max_position_embeddings; yarn's factor: their ratio; betas 32 and 1).
inline RopeScaling rope_parameters_of(nlohmann::json const& p, rope_type type, std::string_view name,
                                      nlohmann::json const& root, std::string_view source, std::size_t positions) {
  RopeScaling r;
  r.type = type;
  double const none = std::numeric_limits<double>::quiet_NaN();
  auto const outer = root.find("original_max_position_embeddings");  // Phi-3 keeps it outside: it then wins
  r.original_max_positions = outer != root.end() && !outer->is_null()
                                 ? config_count(root, "original_max_position_embeddings", source)
                                 : config_count(p, "original_max_position_embeddings", source, positions);
  if (type == rope_type::dynamic) r.original_max_positions = positions;  // transformers: max_position_embeddings
  r.factor = rope_number(p, "factor", name, source,
                         type == rope_type::yarn ? double(positions) / double(r.original_max_positions) : none);
  if (type == rope_type::llama3) {
    r.low_freq_factor = rope_number(p, "low_freq_factor", name, source, none);
    r.high_freq_factor = rope_number(p, "high_freq_factor", name, source, none);
  }
  if (type == rope_type::yarn) {
    r.beta_fast = rope_number(p, "beta_fast", name, source, 32),
    r.beta_slow = rope_number(p, "beta_slow", name, source, 1);
    if (r.beta_fast == 0) r.beta_fast = 32;  // transformers: `get("beta_fast") or 32`
    if (r.beta_slow == 0) r.beta_slow = 1;
    r.attention_factor = rope_number(p, "attention_factor", name, source, 0);
    if (auto a = p.find("attention_factor"); a != p.end() && !a->is_null() && !(r.attention_factor > 0))
      shardwise::raise("shardwise::models::llama_config_from_json: the yarn rotary scaling in ", source,
                       " has attention_factor ", a->dump(), "; it must be positive (or absent, to derive it)");
    r.mscale = rope_number(p, "mscale", name, source, 0);
    r.mscale_all_dim = rope_number(p, "mscale_all_dim", name, source, 0);
    if (auto t = p.find("truncate"); t != p.end()) {  // transformers: `get("truncate", True)`, null is false
      if (!t->is_boolean() && !t->is_null())
        shardwise::raise("shardwise::models::llama_config_from_json: \"truncate\" in the yarn rotary scaling of ",
                         source, " is ", t->dump(), "; it must be true or false");
      r.truncate = t->is_boolean() && t->get<bool>();
    }
  }
  return r;
}

/// The name of the rotary scaling in the scaling object `p` ("rope_type", or transformers 4's "type";
/// "default" when neither).
inline std::string rope_name(nlohmann::json const* p, std::string_view source) {
  if (p)
    for (char const* key : {"rope_type", "type"})
      if (auto t = p->find(key); t != p->end() && !t->is_null()) {
        if (!t->is_string())
          shardwise::raise("shardwise::models::llama_config_from_json: \"", key, "\" in ", source, " is ", t->dump(),
                           "; it must be the name of a rotary scaling");
        return t->get<std::string>();
      }
  return "default";
}

/// The rotary embedding: its base ("rope_theta", `theta` (the family's default) when absent, or transformers 5's
/// "rope_parameters": {"rope_theta": ...}) into c.rope_theta, and its scaling into c.rope_scaling. A type shardwise
/// does not compute is rope_type::unsupported: the planner needs no rotation, and the model and llama_config_from_json
/// refuse it.
inline void read_rope(nlohmann::json const& root, std::string_view source, LlamaConfig& c, double theta = 10000.0) {
  c.rope_theta = config_real(root, "rope_theta", source, theta);
  nlohmann::json const* p = rope_object(root, source);
  if (!p) return;
  c.rope_theta = config_real(*p, "rope_theta", source, c.rope_theta);
  std::string const name = rope_name(p, source);
  rope_type const type = rope_type_named(name);
  if (type == rope_type::plain || type == rope_type::unsupported)
    c.rope_scaling.type = type;
  else
    c.rope_scaling = rope_parameters_of(*p, type, name, root, source, c.sequence);
}

/// `field` of `root` as true or false; false when absent or null.
inline bool config_flag(nlohmann::json const& root, char const* field, std::string_view source) {
  auto const found = root.find(field);
  if (found == root.end() || found->is_null()) return false;
  if (!found->is_boolean())
    shardwise::raise("shardwise::models::llama_config_from_json: \"", field, "\" in ", source, " is ", found->dump(),
                     "; it must be true or false");
  return found->get<bool>();
}

/// What transformers' config class of a family takes for a field the file leaves out.
struct config_defaults {
  std::size_t kv_heads = 0;      ///< num_key_value_heads (0: the query heads)
  std::size_t positions = 2048;  ///< max_position_embeddings
  std::size_t head_dim = 0;      ///< head_dim (0: hidden_size / num_attention_heads)
  double norm_eps = 1e-6;        ///< rms_norm_eps
  double rope_theta = 10000.0;   ///< rope_theta
};

/// LlamaConfig's, Qwen2Config's, Qwen3Config's, MistralConfig's, MixtralConfig's, Qwen2MoeConfig's and
/// Qwen3MoeConfig's defaults.
inline config_defaults family_defaults(std::string_view family) {
  if (family == "qwen2") return {32, 32768};
  if (family == "qwen3") return {32, 32768, 128};
  if (family == "mistral") return {8, 131072};
  if (family == "mixtral") return {8, 131072, 0, 1e-5, 1e6};
  if (family == "qwen2_moe") return {16, 32768};
  if (family == "qwen3_moe") return {4, 32768};
  return {};
}

/// The mixture of experts of a Mixtral, Qwen2-MoE or Qwen3-MoE config.json into c.moe, with the family's defaults:
/// the expert count (num_local_experts or num_experts), num_experts_per_tok, the experts' width (Mixtral's
/// intermediate_size, Qwen's moe_intermediate_size), norm_topk_prob (Mixtral always renormalises), Qwen2-MoE's
/// gated shared expert, and router_aux_loss_coef when output_router_logits is true (transformers adds the loss to
/// the training loss only then). Refuses, naming the field, dense layers among the sparse ones
/// (decoder_sparse_step, mlp_only_layers) and Mixtral's router jitter.
inline void read_experts(nlohmann::json const& root, std::string_view source, std::string_view family, LlamaConfig& c) {
  char const* const who = "llama_config_from_json";
  bool const mixtral = family == "mixtral", qwen2 = family == "qwen2_moe";
  MoeConfig m;
  char const* const count = root.contains("num_local_experts") ? "num_local_experts" : "num_experts";
  m.experts = config_count(root, count, source, mixtral ? 8 : qwen2 ? 60 : 128, who);
  m.top_k = config_count(root, "num_experts_per_tok", source, mixtral ? 2 : qwen2 ? 4 : 8, who);
  m.expert_hidden = mixtral ? c.hidden : config_count(root, "moe_intermediate_size", source, qwen2 ? 1408 : 768, who);
  m.normalize_top_k = mixtral || config_flag(root, "norm_topk_prob", source);
  if (qwen2) m.shared_expert_hidden = config_count(root, "shared_expert_intermediate_size", source, 5632, who);
  if (config_flag(root, "output_router_logits", source))
    m.router_aux_loss_coef = config_real(root, "router_aux_loss_coef", source, 0.001, who);
  auto const refuse = [&](char const* field, nlohmann::json const& value, char const* what) {
    shardwise::raise("shardwise::models::llama_config_from_json: \"", field, "\" in ", source, " is ", value.dump(),
                     ": ", what);
  };
  if (auto v = root.find("decoder_sparse_step"); v != root.end() && !v->is_null() && *v != 1)
    refuse("decoder_sparse_step", *v, "shardwise builds every block with experts; use a model whose step is 1");
  if (auto v = root.find("mlp_only_layers"); v != root.end() && !v->is_null() && !(v->is_array() && v->empty()))
    refuse("mlp_only_layers", *v, "shardwise builds every block with experts; use a model with no dense layers");
  if (auto v = root.find("router_jitter_noise"); v != root.end() && !v->is_null() && *v != 0)
    refuse("router_jitter_noise", *v, "shardwise's router adds no noise; set it to 0.0");
  if (!mixtral && config_flag(root, "use_sliding_window", source))
    refuse("use_sliding_window", root["use_sliding_window"],
           "shardwise reads Qwen's mixtures of experts without a window; use a model with none");
  c.moe = m;
  c.experts().check();
}

/// The Llama fields of a config.json's object (Llama's, or Qwen2's, Qwen3's and Mistral's, which share them), a
/// field left out taking the family's default; head_dim when it is given and not hidden_size / num_attention_heads.
inline LlamaConfig llama_fields(nlohmann::json const& root, std::string_view source, config_defaults defaults = {}) {
  LlamaConfig c;
  c.vocabulary = detail::config_count(root, "vocab_size", source);
  c.dim = detail::config_count(root, "hidden_size", source);
  c.layers = detail::config_count(root, "num_hidden_layers", source);
  c.heads = detail::config_count(root, "num_attention_heads", source);
  c.kv_heads =
      detail::config_count(root, "num_key_value_heads", source, defaults.kv_heads ? defaults.kv_heads : c.heads);
  c.hidden = detail::config_count(root, "intermediate_size", source);
  c.sequence = detail::config_count(root, "max_position_embeddings", source, defaults.positions);
  c.norm_eps = detail::config_real(root, "rms_norm_eps", source, defaults.norm_eps);
  detail::read_rope(root, source, c, defaults.rope_theta);
  c.tie_word_embeddings = config_flag(root, "tie_word_embeddings", source);
  if (root.contains("head_dim") && !root["head_dim"].is_null()) {
    std::size_t const head_dim = detail::config_count(root, "head_dim", source);
    if (head_dim * c.heads != c.dim) c.explicit_head_dim = head_dim;
  } else if (defaults.head_dim != 0 && defaults.head_dim * c.heads != c.dim) {
    c.explicit_head_dim = defaults.head_dim;
  }
  c.check();
  return c;
}

/// Reads the sliding window into `c` as transformers decides it: Mistral's acts on every layer (4096 when the
/// field is left out, none when null), as Mixtral's (none when left out); Qwen2's only with use_sliding_window, on the
/// layers from max_window_layers (28 by default) on; `layer_types`, when given, says which layers slide
/// ("sliding_attention"), which must be the last ones. Llama has no window: one given there is refused, as are layer
/// kinds shardwise does not build.
inline void read_sliding_window(nlohmann::json const& root, std::string_view source, std::string_view family,
                                LlamaConfig& c) {
  char const* const who = "llama_config_from_json";
  auto const refuse = [&](char const* field, std::string const& value, char const* what) {
    shardwise::raise("shardwise::models::llama_config_from_json: \"", field, "\" in ", source, " is ", value, ": ",
                     what);
  };
  auto const field = root.find("sliding_window");
  bool const null_window = field != root.end() && field->is_null();
  if (family == "llama") {
    if (field != root.end() && !null_window)
      refuse("sliding_window", field->dump(),
             "transformers' Llama has no sliding window; give the model_type that has one (\"mistral\", \"qwen2\")");
  } else if (family == "mixtral") {  // Mistral's rule, with no window by default
    if (field != root.end() && !null_window) c.sliding_window = config_count(root, "sliding_window", source, 0, who);
  } else if (!null_window && (family == "mistral" || config_flag(root, "use_sliding_window", source))) {
    c.sliding_window = config_count(root, "sliding_window", source, 4096, who);
    c.first_window_layer = family != "mistral" ? config_count(root, "max_window_layers", source, 28, who) : 0;
  }
  auto const kinds = root.find("layer_types");
  if (kinds == root.end() || kinds->is_null()) {
    if (c.first_window_layer >= c.layers) c.sliding_window = c.first_window_layer = 0;  // no layer slides
    return;
  }
  std::size_t sliding = 0, first = c.layers;
  bool known = kinds->is_array() && kinds->size() == c.layers;
  for (std::size_t i = 0; known && i < kinds->size(); ++i) {
    auto const& kind = (*kinds)[i];
    if (kind == "sliding_attention")
      first = std::min(first, i), ++sliding;
    else
      known = kind == "full_attention";
  }
  if (!known)
    refuse("layer_types", kinds->dump(),
           "shardwise builds one \"full_attention\" or \"sliding_attention\" entry per layer; use a model with "
           "those");
  if (sliding != c.layers - first)
    refuse("layer_types", kinds->dump(),
           "shardwise slides the window on the last layers only (from one layer on, as Qwen2's max_window_layers); "
           "use a model whose sliding layers are the last ones");
  if (sliding != 0 && c.sliding_window == 0)
    refuse("layer_types", kinds->dump(), "sliding layers with no window (sliding_window); give the window");
  c.first_window_layer = sliding == 0 ? 0 : first;
  if (sliding == 0) c.sliding_window = 0;
}

/// Refuses, naming the field and the fix, every field of a Llama config.json that would change the numbers and
/// that shardwise's Llama does not compute (docs/models.md lists the fields read and those ignored).
inline void refuse_unbuilt_llama_fields(nlohmann::json const& root, std::string_view source, LlamaConfig const& c) {
  auto const refuse = [&](char const* field, nlohmann::json const& value, char const* what) {
    shardwise::raise("shardwise::models::llama_config_from_json: \"", field, "\" in ", source, " is ", value.dump(),
                     ": ", what);
  };
  auto const set = [&](char const* field) {
    auto const found = root.find(field);
    return found != root.end() && !found->is_null() ? &*found : nullptr;
  };
  if (auto v = set("hidden_act"); v && *v != "silu")
    refuse("hidden_act", *v, "shardwise's Llama computes SiLU (\"silu\") only; use a model with SiLU");
  if (auto v = set("attention_dropout"); v && (!v->is_number() || v->get<double>() != 0))
    refuse("attention_dropout", *v,
           "shardwise's attention has no dropout; set it to 0.0 (dropout changes nothing outside training)");
  nlohmann::json const* rope = rope_object(root, source);
  for (nlohmann::json const* where : {&root, rope}) {  // at the top level, or in the scaling
    if (!where) continue;
    auto const v = where->find("partial_rotary_factor");
    if (v != where->end() && !v->is_null() && (!v->is_number() || v->get<double>() != 1))
      refuse("partial_rotary_factor", *v, "shardwise's Llama rotates every column of a head; use 1.0");
  }
  for (char const* experts : {"num_experts", "num_local_experts", "n_routed_experts", "num_experts_per_tok"})
    if (auto v = set(experts); v && *v != 0 && !c.moe)
      refuse(experts, *v, "a mixture of experts, which shardwise's Llama is not; use a dense model");
  if (c.rope_scaling.type == rope_type::unsupported)
    shardwise::raise("shardwise::models::llama_config_from_json: the rotary scaling \"", rope_name(rope, source),
                     "\" in ", source,
                     " is not computed by shardwise (it computes \"default\", \"linear\", \"llama3\", \"yarn\" and "
                     "\"dynamic\"); use a model with one of those");
}
}  // namespace detail

}  // namespace shardwise::models
