#pragma once
// bf16 as the kernels hold it: the upper 16 bits of an fp32 (std::uint16_t), rounded to nearest even.
#include <bit>
#include <cstdint>

namespace shardwise::detail {

/// `x` rounded to bf16 to nearest even, as torch's x.to(torch.bfloat16); a NaN stays a (quiet) NaN.
[[nodiscard]] inline std::uint16_t to_bf16(float x) {
  auto const bits = std::bit_cast<std::uint32_t>(x);
  std::uint32_t const nan = (bits >> 16) | 0x40u, rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  return static_cast<std::uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded);  // no branch: vectorised
}

/// The fp32 value of a bf16 one (exact).
[[nodiscard]] inline float from_bf16(std::uint16_t h) { return std::bit_cast<float>(std::uint32_t{h} << 16); }

}  // namespace shardwise::detail
