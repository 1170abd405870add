#pragma once
// The names Hugging Face transformers' LlamaForCausalLM gives the parameters of shardwise's models::Llama (same
// layouts: weights [out, in], rotate-half rotary embeddings), for consolidated checkpoints transformers loads; and
// those of a mixture of experts' blocks (models::MoeLlama) as Qwen2-MoE / Qwen3-MoE, Mixtral, or transformers 5's
// fused experts name them.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/core/error.hpp"

namespace shardwise {

/// How a checkpoint names a mixture of experts' tensors (models::MoeLlama's "layers.N.feed_forward.*").
enum class transformers_experts {
  /// One tensor per expert and projection under "mlp." (Qwen2-MoE's and Qwen3-MoE's save_pretrained):
  /// mlp.gate, mlp.experts.E.gate_proj / up_proj / down_proj, mlp.shared_expert.*, mlp.shared_expert_gate.
  per_expert,
  /// Mixtral's: block_sparse_moe.gate, block_sparse_moe.experts.E.w1 / w3 / w2.
  mixtral,
  /// transformers 5's fused experts, as its models hold them: mlp.experts.gate_up_proj [experts, 2 x hidden, dim]
  /// (each expert's gate rows, then its up rows) and mlp.experts.down_proj [experts, dim, hidden].
  fused,
};

namespace detail {
/// The layer number and the rest of "layers.N.rest", or nullopt.
inline std::optional<std::pair<std::string, std::string_view>> layer_and_leaf(std::string_view name) {
  if (name.substr(0, 7) != "layers.") return std::nullopt;
  name.remove_prefix(7);
  std::size_t const dot = name.find('.');
  if (dot == std::string_view::npos || dot == 0 ||
      name.substr(0, dot).find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  return std::pair{std::string(name.substr(0, dot)), name.substr(dot + 1)};
}

/// `leaf` renamed by the first pair whose `from` it equals, or begins with when `from` ends in '.' and the rest is
/// "weight" or "bias" (q_proj.bias); empty when none.
struct name_pair {
  std::string_view from, to;
};
template <std::size_t N>
std::string renamed(std::string_view leaf, name_pair const (&names)[N]) {
  for (auto const& [from, to] : names) {
    if (leaf == from) return std::string(to);
    bool const projection = from.back() == '.' && leaf.substr(0, from.size()) == from;
    std::string_view const kind = projection ? leaf.substr(from.size()) : std::string_view();
    if (kind == "weight" || kind == "bias") return std::string(to) + std::string(kind);
  }
  return {};
}

/// The name of an expert's projection ("experts.3.w1.weight", the leaf after "feed_forward."), per expert.
inline std::string expert_name(std::string_view leaf, bool mixtral) {
  static constexpr name_pair qwen[] = {{"w1.", "gate_proj."}, {"w3.", "up_proj."}, {"w2.", "down_proj."}};
  static constexpr name_pair mistral[] = {{"w1.", "w1."}, {"w3.", "w3."}, {"w2.", "w2."}};
  std::size_t const dot = leaf.find('.', 8);  // after "experts."
  if (leaf.substr(0, 8) != "experts." || dot == std::string_view::npos) return {};
  std::string const projection = mixtral ? renamed(leaf.substr(dot + 1), mistral) : renamed(leaf.substr(dot + 1), qwen);
  return projection.empty() ? std::string() : std::string(leaf.substr(0, dot + 1)) + projection;
}

/// The transformers name of a block's "feed_forward.<leaf>" in a model of experts, per expert.
inline std::string experts_leaf_name(std::string_view leaf, transformers_experts layout) {
  bool const mixtral = layout == transformers_experts::mixtral;
  std::string const prefix = mixtral ? "block_sparse_moe." : "mlp.";
  if (leaf == "gate.weight") return prefix + "gate.weight";
  if (leaf.substr(0, 8) == "experts.") {
    std::string const expert = expert_name(leaf, mixtral);
    return expert.empty() ? expert : prefix + expert;
  }
  static constexpr name_pair shared[] = {{"shared_expert.w1.", "shared_expert.gate_proj."},
                                         {"shared_expert.w3.", "shared_expert.up_proj."},
                                         {"shared_expert.w2.", "shared_expert.down_proj."},
                                         {"shared_expert_gate.weight", "shared_expert_gate.weight"}};
  std::string const found = mixtral ? std::string() : renamed(leaf, shared);
  return found.empty() ? found : prefix + found;
}
}  // namespace detail

namespace detail {
/// transformers_llama_name, a mixture of experts' tensors named as `experts` says (fused experts have no name per
/// expert: transformers_llama_mapping finds each in its stacked tensor).
[[nodiscard]] inline std::string transformers_llama_name(std::string const& name, transformers_experts experts) {
  if (name == "tok_embeddings.weight") return "model.embed_tokens.weight";
  if (name == "norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (auto const split = layer_and_leaf(name)) {
    auto const& [layer, leaf] = *split;
    static constexpr name_pair names[] = {{"attention_norm.weight", "input_layernorm.weight"},
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
    std::string found = renamed(leaf, names);
    if (found.empty() && leaf.substr(0, 13) == "feed_forward.")  // fused: the router's and shared expert's names
      found = experts_leaf_name(leaf.substr(13), experts);
    if (!found.empty()) return "model.layers." + layer + "." + found;
  }
  fail("shardwise::transformers_llama_name: tensor \"", name,
       "\" is not a parameter of shardwise's Llama; consolidate without Hugging Face names (--names shardwise)");
}
}  // namespace detail

/// "layers.0.attention.wq.weight" -> "model.layers.0.self_attn.q_proj.weight" (and a projection's bias, as
/// Qwen2's q_proj.bias; Qwen3's q_norm and k_norm); a mixture of experts' tensors as Qwen2-MoE and Qwen3-MoE name
/// them ("layers.0.feed_forward.experts.3.w1.weight" -> "model.layers.0.mlp.experts.3.gate_proj.weight").
/// Throws for a name the Llama model does not have.
[[nodiscard]] inline std::string transformers_llama_name(std::string const& name) {
  return detail::transformers_llama_name(name, transformers_experts::per_expert);
}

/// transformers_llama_name, a mixture of experts' tensors as Mixtral names them
/// ("layers.0.feed_forward.experts.3.w1.weight" -> "model.layers.0.block_sparse_moe.experts.3.w1.weight").
[[nodiscard]] inline std::string transformers_mixtral_name(std::string const& name) {
  return detail::transformers_llama_name(name, transformers_experts::mixtral);
}

namespace detail {
/// The source of an expert's projection in transformers 5's fused experts of inner width `hidden`: its [expert] of
/// gate_up_proj (the gate's rows, then the up's) or of down_proj; nullopt for a name that is not an expert's weight.
inline std::optional<tensor_source> fused_expert_source(std::string const& name, std::uint64_t hidden) {
  auto const split = layer_and_leaf(name);
  if (!split || split->second.substr(0, 21) != "feed_forward.experts.") return std::nullopt;
  std::string_view const rest = split->second.substr(21);
  std::size_t const dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot > 9 ||
      rest.substr(0, dot).find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  std::int64_t const expert = std::stoll(std::string(rest.substr(0, dot)));
  std::string_view const projection = rest.substr(dot + 1);
  std::string const prefix = "model.layers." + split->first + ".mlp.experts.";
  if (projection == "w2.weight") return tensor_source{.name = prefix + "down_proj", .stacked_index = expert};
  if (projection != "w1.weight" && projection != "w3.weight") return std::nullopt;
  return tensor_source{.name = prefix + "gate_up_proj",
                       .slice_dim = 0,
                       .slice_start = projection == "w1.weight" ? 0 : hidden,
                       .slice_size = hidden,
                       .slice_of = 2 * hidden,
                       .stacked_index = expert};
}
}  // namespace detail

/// The mapping for sw::load_pretrained of a LlamaForCausalLM save_pretrained folder (or its model.safetensors)
/// into shardwise's models::Llama: every tensor whole and as stored, under transformers_llama_name's names; a
/// mixture of experts' as `experts` says (transformers_experts_in tells a folder's), fused experts with their
/// inner width `expert_hidden` (LlamaConfig::moe->expert_hidden).
[[nodiscard]] inline checkpoint_mapping transformers_llama_mapping(
    transformers_experts experts = transformers_experts::per_expert, std::size_t expert_hidden = 0) {
  if (experts == transformers_experts::fused && expert_hidden == 0)
    detail::fail(
        "shardwise::transformers_llama_mapping: fused experts need their inner width (expert_hidden, the "
        "config's moe->expert_hidden) to find each expert's gate and up rows; give it");
  return [experts, expert_hidden](std::string const& name) -> std::optional<tensor_source> {
    if (experts == transformers_experts::fused)
      if (auto const fused = detail::fused_expert_source(name, expert_hidden)) return fused;
    return tensor_source{detail::transformers_llama_name(name, experts)};
  };
}

/// How the experts of the save_pretrained folder (or safetensors file) at `path` are named: Mixtral's when it
/// holds "block_sparse_moe." tensors, fused when it holds "mlp.experts.gate_up_proj" ones, else one per expert.
[[nodiscard]] inline transformers_experts transformers_experts_in(std::filesystem::path const& path) {
  detail::pretrained_files const files = detail::find_pretrained_files(path, "transformers_experts_in");
  for (auto const& [name, file] : files.file_of) {
    if (name.find(".block_sparse_moe.") != std::string::npos) return transformers_experts::mixtral;
    if (name.find(".mlp.experts.gate_up_proj") != std::string::npos) return transformers_experts::fused;
  }
  return transformers_experts::per_expert;
}

}  // namespace shardwise
