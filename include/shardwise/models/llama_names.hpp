#pragma once
// The names Hugging Face transformers' LlamaForCausalLM gives the parameters of shardwise's models::Llama (same
// layouts: weights [out, in], rotate-half rotary embeddings), for consolidated checkpoints transformers loads.
#include <string>
#include <string_view>

#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/core/error.hpp"

namespace shardwise {

/// "layers.0.attention.wq.weight" -> "model.layers.0.self_attn.q_proj.weight" (and a projection's bias, as
/// Qwen2's q_proj.bias; Qwen3's q_norm and k_norm); throws for a name the Llama model does not have.
[[nodiscard]] inline std::string transformers_llama_name(std::string const& name) {
  if (name == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  std::string_view rest(name);
  if (rest.substr(0, 7) == "layers.") {
    rest.remove_prefix(7);
    std::size_t const dot = rest.find('.');
    if (dot != std::string_view::npos && dot > 0 &&
        rest.substr(0, dot).find_first_not_of("0123456789") == std::string_view::npos) {
      std::string const prefix = "model.layers." + std::string(rest.substr(0, dot)) + ".";
      std::string_view const leaf = rest.substr(dot + 1);
      struct pair {
        std::string_view from, to;
      };
      static constexpr pair names[] = {{"attention_norm.weight", "input_layernorm.weight"},
                                       {"ffn_norm.weight", "post_attention_layernorm.weight"},
                                       {"attention.wq.", "self_attn.q_proj."},
                                       {"attention.wk.", "self_attn.k_proj."},
                                       {"attention.wv.", "self_attn.v_proj."},
                                       {"attention.wo.", "self_attn.o_proj."},
                                       {"attention.q_norm.weight", "self_attn.q_norm.weight"},  // Qwen3's
                                       {"attention.k_norm.weight", "self_attn.k_norm.weight"},
                                       {"feed_forward.w1.", "mlp.gate_proj."},
                                       {"feed_forward.w3.", "mlp.up_proj."},
                                       {"feed_forward.w2.", "mlp.down_proj."}};
      for (auto const& [from, to] : names) {
        if (leaf == from) return prefix + std::string(to);
        bool const projection = from.back() == '.' && leaf.substr(0, from.size()) == from;
        std::string_view const kind = projection ? leaf.substr(from.size()) : std::string_view();
        if (kind == "weight" || kind == "bias") return prefix + std::string(to) + std::string(kind);  // q_proj.bias
      }
    }
  }
  detail::fail(
      "shardwise::transformers_llama_name: tensor \"", name,
      "\" is not a parameter of shardwise's Llama; consolidate without Hugging Face names (--names shardwise)");
}

/// The mapping for sw::load_pretrained of a LlamaForCausalLM save_pretrained folder (or its model.safetensors)
/// into shardwise's models::Llama: every tensor whole and as stored, under transformers_llama_name's names.
[[nodiscard]] inline checkpoint_mapping transformers_llama_mapping() {
  return [](std::string const& name) -> std::optional<tensor_source> {
    return tensor_source{transformers_llama_name(name)};
  };
}

}  // namespace shardwise
