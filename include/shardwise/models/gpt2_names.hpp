#pragma once
// Where Hugging Face transformers' GPT2LMHeadModel keeps each parameter of shardwise's models::GPT2, for
// sw::load_pretrained: the names under "transformer.", every Conv1D weight stored [in, out] (transposed), and
// q, k and v fused along the outputs into one c_attn (rows [0, dim), [dim, 2 dim), [2 dim, 3 dim) of
// c_attn.weightᵀ and of c_attn.bias).
//
//   sw::load_pretrained(model, tp, "gpt2_folder", sw::transformers_gpt2_mapping(config.dim));
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/core/error.hpp"

namespace shardwise {

/// "h.0.attn.k_proj.weight" -> transformer.h.0.attn.c_attn.weight, transposed, rows [dim, 2 dim); `dim` is the
/// model's width (n_embd). "lm_head.weight" -> "lm_head.weight": GPT2LMHeadModel ties it to wte and
/// save_pretrained leaves it out, and a tied model does not ask for it (a file that has it: see load_pretrained).
/// Throws for a name shardwise's GPT-2 does not have.
[[nodiscard]] inline tensor_source transformers_gpt2_source(std::string const& name, std::uint64_t dim) {
  if (name == "lm_head.weight") return tensor_source{name};
  if (name == "wte.weight" || name == "wpe.weight" || name == "ln_f.weight" || name == "ln_f.bias")
    return tensor_source{"transformer." + name};
  std::string_view rest(name);
  if (rest.substr(0, 2) == "h.") {
    rest.remove_prefix(2);
    std::size_t const dot = rest.find('.');
    if (dot != std::string_view::npos && dot > 0 &&
        rest.substr(0, dot).find_first_not_of("0123456789") == std::string_view::npos) {
      std::string const prefix = "transformer.h." + std::string(rest.substr(0, dot)) + ".";
      std::string_view const leaf = rest.substr(dot + 1);
      std::size_t const last = leaf.rfind('.');
      std::string_view const layer = leaf.substr(0, last), kind = leaf.substr(last + 1);
      if (last != std::string_view::npos && (kind == "weight" || kind == "bias")) {
        bool const weight = kind == "weight";
        if (layer == "ln_1" || layer == "ln_2") return tensor_source{prefix + std::string(leaf)};
        if (layer == "attn.c_proj" || layer == "mlp.c_fc" || layer == "mlp.c_proj")
          return tensor_source{prefix + std::string(leaf), weight};  // Conv1D: [in, out]
        std::string_view const fused[] = {"attn.q_proj", "attn.k_proj", "attn.v_proj"};
        for (std::uint64_t i = 0; i < 3; ++i)  // c_attn = [q | k | v] along its outputs
          if (layer == fused[i])
            return tensor_source{prefix + "attn.c_attn." + std::string(kind), weight, 0, i * dim, dim, 3 * dim};
      }
    }
  }
  detail::fail("shardwise::transformers_gpt2_source: tensor \"", name,
               "\" is not a parameter of shardwise's GPT-2 (models::GPT2); map it with a mapping of your own");
}

/// The mapping for sw::load_pretrained of a GPT2LMHeadModel checkpoint (save_pretrained's folder, or its
/// model.safetensors) into shardwise's models::GPT2 of width `dim`.
[[nodiscard]] inline checkpoint_mapping transformers_gpt2_mapping(std::uint64_t dim) {
  return [dim](std::string const& name) -> std::optional<tensor_source> { return transformers_gpt2_source(name, dim); };
}

}  // namespace shardwise
