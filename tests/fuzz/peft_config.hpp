// The fuzz target (readers_fuzz.cpp) for peft's adapter_config.json (scripts/fuzz.sh): any text must either read
// into a LoRA shardwise computes (a rank in range, a finite alpha, targets named) or be refused with shardwise::error.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <shardwise/checkpoint/peft_config.hpp>
#include <string_view>

namespace fuzz_readers {
namespace sw = shardwise;

inline void peft_config(std::uint8_t const* data, std::size_t size) {
  try {
    auto const read =
        sw::detail::peft_config_from_json(std::string_view(reinterpret_cast<char const*>(data), size), "fuzz.json");
    if (read.lora.rank < 1 || read.lora.rank > sw::detail::max_peft_rank || !std::isfinite(read.lora.alpha))
      __builtin_trap();
    if (read.all_linear == !read.lora.target_modules.empty()) __builtin_trap();
  } catch (sw::error const&) {
    // refused with a message: what bad input must get
  }
}
}  // namespace fuzz_readers
