#pragma once
// The fingerprint the agreements across ranks compare (a collective call's shape, an FSDP model's structure,
// generate's prompts and options): values folded one at a time into 64 bits.
#include <cstdint>
#include <string_view>

namespace shardwise::detail {

/// Folds v into h: splitmix64 of their sum.
constexpr std::uint64_t fold_hash(std::uint64_t h, std::uint64_t v) {
  std::uint64_t z = h + v + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Folds a text into h: its length, then byte by byte.
constexpr std::uint64_t fold_hash(std::uint64_t h, std::string_view text) {
  h = fold_hash(h, text.size());
  for (char c : text) h = fold_hash(h, static_cast<std::uint64_t>(static_cast<unsigned char>(c)));
  return h;
}

}  // namespace shardwise::detail
