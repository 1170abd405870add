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

namespace detail {

/// checksum64 of bytes given in parts: update() with each part in order, then finish(). Equal to checksum64 of
/// the concatenation however it is split, so a file can be checksummed while it is written from many buffers.
class checksum_stream {
 public:
  /// Adds the next bytes.
  void update(std::span<std::byte const> bytes) {
    length_ += bytes.size();
    if (carried_ > 0) {  // complete the carried block first
      std::size_t const take = bytes.size() < 32 - carried_ ? bytes.size() : 32 - carried_;
      std::memcpy(carry_.data() + carried_, bytes.data(), take);
      carried_ += take;
      bytes = bytes.subspan(take);
      if (carried_ < 32) return;
      blocks(carry_.data(), 32);
      carried_ = 0;
    }
    std::size_t const whole = bytes.size() / 32 * 32;
    blocks(bytes.data(), whole);
    carried_ = bytes.size() - whole;
    if (carried_ > 0) std::memcpy(carry_.data(), bytes.data() + whole, carried_);
  }

  /// The checksum of every byte added.
  [[nodiscard]] std::uint64_t finish() const {
    std::uint64_t h = length_;  // the length, so that trailing zero bytes count
    for (std::size_t i = 0; i < carried_; i += 8) {
      std::uint64_t w = 0;
      std::memcpy(&w, carry_.data() + i, carried_ - i < 8 ? carried_ - i : 8);
      h = (h ^ w) * odd;
    }
    for (std::uint64_t l : lane_) h = (h ^ l) * odd;  // one-to-one in each lane for the others fixed
    return h ^ (h >> 29);
  }

 private:
  static constexpr std::uint64_t odd = 0x9e3779b97f4a7c15ull;

  // Whole 32-byte blocks (n is a multiple of 32), each 8-byte word into its lane; the lanes kept in locals so
  // that the loop runs at memory speed.
  void blocks(std::byte const* data, std::size_t n) {
    std::uint64_t a = lane_[0], b = lane_[1], c = lane_[2], d = lane_[3];
    for (std::size_t i = 0; i < n; i += 32) {
      std::uint64_t w[4];
      std::memcpy(w, data + i, 32);
      a = (a ^ w[0]) * odd, b = (b ^ w[1]) * odd, c = (c ^ w[2]) * odd, d = (d ^ w[3]) * odd;
    }
    lane_ = {a, b, c, d};
  }

  std::array<std::uint64_t, 4> lane_{0x243f6a8885a308d3ull, 0x13198a2e03707344ull, 0xa4093822299f31d0ull,
                                     0x082efa98ec4e6c89ull};
  std::array<std::byte, 32> carry_{};
  std::size_t carried_ = 0;
  std::uint64_t length_ = 0;
};

}  // namespace detail

/// The checksum of `bytes` (see the header comment): equal inputs give equal sums; one changed byte never does.
[[nodiscard]] inline std::uint64_t checksum64(std::span<std::byte const> bytes) {
  detail::checksum_stream sum;
  sum.update(bytes);
  return sum.finish();
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
