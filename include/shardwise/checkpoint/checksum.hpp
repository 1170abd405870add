#pragma once
// The checksum of a tensor's stored bytes, kept in a sharded checkpoint's index and rank files and checked on
// load and by `shardwise verify`. Not cryptographic: it is there to catch damage. Each 8-byte word goes
// through a step that is one-to-one (xor, then multiply by an odd constant, per lane), so changing any one
// word — any single byte — always changes the result; four lanes keep it at memory speed.
#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>

namespace shardwise {

/// The checksum of `bytes` (see the header comment): equal inputs give equal sums; one changed byte never does.
[[nodiscard]] inline std::uint64_t checksum64(std::span<std::byte const> bytes) {
  constexpr std::uint64_t odd = 0x9e3779b97f4a7c15ull;
  std::array<std::uint64_t, 4> lane{0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                                    0x082efa98ec4e6c89ull};
  std::size_t const n = bytes.size(), whole = n / 32 * 32;
  for (std::size_t i = 0; i < whole; i += 32)
    for (std::size_t l = 0; l < 4; ++l) {
      std::uint64_t w;
      std::memcpy(&w, bytes.data() + i + 8 * l, 8);
      lane[l] = (lane[l] ^ w) * odd;
    }
  std::uint64_t h = n;  // the length, so that trailing zero bytes count
  for (std::size_t i = whole; i < n; i += 8) {
    std::uint64_t w = 0;
    std::memcpy(&w, bytes.data() + i, n - i < 8 ? n - i : 8);
    h = (h ^ w) * odd;
  }
  for (std::uint64_t l : lane) h = (h ^ l) * odd;  // one-to-one in each lane for the others fixed
  return h ^ (h >> 29);
}

namespace detail {

/// 16 hex digits.
inline std::string hex64(std::uint64_t v) {
  std::string s(16, '0');
  for (int i = 15; i >= 0; --i, v >>= 4) s[static_cast<std::size_t>(i)] = "0123456789abcdef"[v & 15];
  return s;
}

}  // namespace detail
}  // namespace shardwise
