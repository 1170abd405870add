// The fuzz target (readers_fuzz.cpp) for a transformers config.json read as a Llama config, as a GPT-2 config and by
// the planner (planner::model_from_json: llama, qwen2, qwen3, mistral, gpt2) (scripts/fuzz.sh): any text must either
// give a config whose sizes are positive and whose heads divide the width (or have their own even head_dim), or be
// refused with shardwise::error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shardwise/models/gpt2_config_json.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/planner/models.hpp>
#include <string>
#include <string_view>

namespace fuzz_readers {
namespace sw = shardwise;

inline void llama_config(std::uint8_t const* data, std::size_t size) {
  std::string_view const text(reinterpret_cast<char const*>(data), size);
  try {
    auto const c = sw::models::llama_config_from_json(text);
    bool const heads_fit = c.explicit_head_dim != 0 || c.dim % c.heads == 0;  // or head_dim given (Qwen3's)
    if (c.dim == 0 || c.heads == 0 || c.layers == 0 || c.vocabulary == 0 || !heads_fit || c.head_dim() == 0 ||
        c.head_dim() % 2 != 0)
      __builtin_trap();
  } catch (sw::error const&) {
    // refused with a message: what bad input must get
  }
  try {
    auto const c = sw::models::gpt2_config_from_json(text);
    if (c.dim == 0 || c.heads == 0 || c.layers == 0 || c.vocabulary == 0 || c.sequence == 0) __builtin_trap();
  } catch (sw::error const&) {
  }
  try {
    auto const d = sw::planner::model_from_json(std::string(text), "config.json");
    if (d.dim == 0 || d.heads == 0 || d.layers == 0 || d.vocabulary == 0 || d.kv_heads == 0) __builtin_trap();
  } catch (sw::error const&) {
  }
}
}  // namespace fuzz_readers
