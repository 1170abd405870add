// The fuzz target (readers_fuzz.cpp) for a Hugging Face shard index (model.safetensors.index.json, scripts/fuzz.sh):
// any text must either read into tensor -> file entries inside the folder, or be refused with shardwise::error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <shardwise/checkpoint/pretrained.hpp>
#include <string_view>

namespace fuzz_readers {
namespace sw = shardwise;

inline void pretrained_index(std::uint8_t const* data, std::size_t size) {
  sw::detail::pretrained_files found{".", "fuzz.index.json", {}, {}};
  try {
    sw::detail::pretrained_index_from_json(std::string_view(reinterpret_cast<char const*>(data), size), found,
                                           "load_pretrained");
    for (auto const& [name, file] : found.file_of)
      if (file.empty() || file.front() == '/' || file.find("..") != std::string::npos) __builtin_trap();
  } catch (sw::error const&) {
    // refused with a message: what bad input must get
  }
}
}  // namespace fuzz_readers
