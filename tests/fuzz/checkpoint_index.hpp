// The fuzz target (readers_fuzz.cpp) for a sharded checkpoint's index (shardwise_checkpoint.json, scripts/fuzz.sh): any
// text must either read into an index whose tensors' pieces cover each tensor exactly once, or be refused with
// shardwise::error; every other exception, crash, hang or undefined behaviour is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shardwise/checkpoint/sharded_index.hpp>
#include <string_view>

namespace fuzz_readers {
namespace sw = shardwise;

inline void checkpoint_index(std::uint8_t const* data, std::size_t size) {
  try {
    sw::checkpoint_index const index =
        sw::checkpoint_index_from_json(std::string_view(reinterpret_cast<char const*>(data), size), "fuzz.json");
    if (index.tp < 1 || index.pp < 1 || index.dp < 1) __builtin_trap();
    for (auto const& t : index.tensors) {
      std::uint64_t covered = 0;
      for (auto const& p : t.pieces) covered += sw::detail::volume(p.shape);
      if (covered != sw::detail::volume(t.shape)) __builtin_trap();
    }
  } catch (sw::error const&) {
    // refused with a message: what bad input must get
  }
}
}  // namespace fuzz_readers
