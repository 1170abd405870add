// The fuzz target (readers_fuzz.cpp) for the safetensors header parser (scripts/fuzz.sh builds it with clang and
// -fsanitize=fuzzer,address,undefined and runs it on tests/fuzz/corpus). Any input must either parse into
// tensors whose bytes lie inside the input, or be refused with shardwise::error: every other exception, crash,
// out-of-bounds read, leak or undefined behaviour is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <shardwise/checkpoint/safetensors_header.hpp>
#include <shardwise/checkpoint/safetensors_read.hpp>
#include <span>
#include <vector>

namespace fuzz_readers {
namespace sw = shardwise;

inline void safetensors_header(std::uint8_t const* data, std::size_t size) {
  std::span<std::byte const> const file(reinterpret_cast<std::byte const*>(data), size);
  try {
    sw::safetensors_header const header = sw::parse_safetensors_header(file, "fuzz.safetensors");
    // Decode every tensor as its own type (or as double for floating ones): ASan checks every byte read lies
    // in the input, as the header check promises.
    std::vector<double> values;
    std::vector<std::uint8_t> raw;
    std::uint64_t previous_end = 0;
    for (sw::tensor_info const& t : header.tensors) {
      if (t.begin != previous_end || t.end < t.begin || header.data_start + t.end > size) __builtin_trap();
      previous_end = t.end;
      if (t.elements() * sw::dtype_size(t.type) != t.bytes()) __builtin_trap();
      std::byte const* bytes = file.data() + header.data_start + t.begin;
      if (sw::is_floating(t.type)) {
        values.resize(static_cast<std::size_t>(t.elements()));
        sw::detail::decode_elements(bytes, t.type, values.data(), values.size());
      } else {
        raw.resize(static_cast<std::size_t>(t.bytes()));
        if (!raw.empty()) std::memcpy(raw.data(), bytes, raw.size());
      }
      if (header.find(t.name) != &t) __builtin_trap();
    }
    if (previous_end != header.data_size) __builtin_trap();
  } catch (sw::error const&) {
    // refused with a message: what bad input must get
  }
}
}  // namespace fuzz_readers
