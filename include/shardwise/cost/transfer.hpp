#pragma once
// What moves between ranks, as values: a collective or point-to-point transfer (kind, mesh axis, bytes, how
// many times in a row) and an ordered list of them. The same types hold a plan's predicted communication
// (constexpr, sw::cost) and what a counting mesh recorded on a run (sw::counting), so the two compare with ==.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <ostream>
#include <stdexcept>
#include <string_view>
#include <vector>

namespace shardwise {

/// The kinds of communication a rank takes part in.
enum class transfer_kind : std::uint8_t {
  all_reduce,      ///< Bytes: the buffer reduced.
  all_gather,      ///< Bytes: this rank's piece (its input).
  reduce_scatter,  ///< Bytes: this rank's whole input (before the scatter).
  broadcast,       ///< Bytes: the buffer this rank passes (a receiver's empty one, to be resized: 0).
  all_to_all,      ///< Bytes: this rank's input.
  gather_values,   ///< Bytes: this rank's small record (shapes, flags, checksums).
  barrier,         ///< Bytes: 0.
  send,            ///< Bytes: the message.
  recv             ///< Bytes: the message.
};

/// The kind's name, as the collectives are spelled ("all_reduce").
constexpr std::string_view transfer_kind_name(transfer_kind kind) {
  constexpr std::array<std::string_view, 9> names{"all_reduce", "all_gather", "reduce_scatter",
                                                  "broadcast",  "all_to_all", "gather_values",
                                                  "barrier",    "send",       "recv"};
  return names[static_cast<std::size_t>(kind)];
}

/// A mesh axis' name held by value (up to 23 characters), so transfers are plain constexpr data.
class axis_label {
 public:
  constexpr axis_label() = default;
  /// The name `name`, cut to 23 characters.
  constexpr axis_label(std::string_view name) {  // NOLINT(google-explicit-constructor): a name is a label
    length_ = std::min(name.size(), chars_.size());
    std::copy_n(name.begin(), length_, chars_.begin());
  }
  /// The name (a C string literal converts too).
  constexpr axis_label(char const* name) : axis_label(std::string_view(name)) {}  // NOLINT
  /// The name as text.
  [[nodiscard]] constexpr std::string_view view() const { return {chars_.data(), length_}; }
  /// Same name.
  friend constexpr bool operator==(axis_label const& a, axis_label const& b) { return a.view() == b.view(); }

 private:
  std::array<char, 23> chars_{};
  std::size_t length_ = 0;
};

/// One entry of a communication list: `count` calls in a row of `kind` on mesh axis `axis`, each moving
/// `bytes` on this rank (see transfer_kind for what the bytes count).
struct transfer {
  transfer_kind kind{};   ///< What kind of communication.
  axis_label axis;        ///< The mesh axis it runs on ("tp", "dp", "pp").
  std::size_t bytes = 0;  ///< Bytes per call on this rank.
  std::size_t count = 1;  ///< Identical calls in a row.

  /// Same kind, axis and bytes (count aside): entries that merge.
  [[nodiscard]] constexpr bool same_call(transfer const& other) const {
    return kind == other.kind && axis == other.axis && bytes == other.bytes;
  }
  /// Everything equal, count included.
  friend constexpr bool operator==(transfer const& a, transfer const& b) = default;
  /// "all_reduce on tp: 2 x 4096 B".
  friend std::ostream& operator<<(std::ostream& out, transfer const& t) {
    return out << transfer_kind_name(t.kind) << " on " << t.axis.view() << ": " << t.count << " x " << t.bytes << " B";
  }
};

/// An ordered list of transfers in which identical calls in a row are one entry with a count; constexpr, with
/// room for Capacity entries (adding beyond it is a compile error in a constant expression, an exception at
/// run time).
template <std::size_t Capacity = 48>
class transfer_list {
 public:
  constexpr transfer_list() = default;

  /// Appends `t`, merging it into the last entry when it is the same call.
  constexpr transfer_list& add(transfer const& t) {
    if (t.count == 0) return *this;
    if (size_ > 0 && items_[size_ - 1].same_call(t)) {
      items_[size_ - 1].count += t.count;
    } else {
      if (size_ == Capacity) throw_full();
      items_[size_++] = t;
    }
    return *this;
  }
  /// Appends `kind` on `axis` of `bytes`, `count` times.
  constexpr transfer_list& add(transfer_kind kind, axis_label axis, std::size_t bytes, std::size_t count = 1) {
    return add(transfer{kind, axis, bytes, count});
  }
  /// Appends every entry of `other`, in order.
  template <std::size_t N>
  constexpr transfer_list& append(transfer_list<N> const& other) {
    for (transfer const& t : other) add(t);
    return *this;
  }
  /// Appends `other` `times` times.
  template <std::size_t N>
  constexpr transfer_list& append(transfer_list<N> const& other, std::size_t times) {
    for (std::size_t i = 0; i < times; ++i) append(other);
    return *this;
  }

  [[nodiscard]] constexpr std::size_t size() const { return size_; }  ///< Entries (runs of identical calls).
  [[nodiscard]] constexpr bool empty() const { return size_ == 0; }   ///< No transfer at all.
  /// Entry i.
  [[nodiscard]] constexpr transfer const& operator[](std::size_t i) const { return items_[i]; }
  [[nodiscard]] constexpr transfer const* begin() const { return items_.data(); }        ///< First entry.
  [[nodiscard]] constexpr transfer const* end() const { return items_.data() + size_; }  ///< Past the last.

  /// Calls of `kind` (all axes when `axis` is empty).
  [[nodiscard]] constexpr std::size_t calls(transfer_kind kind, std::string_view axis = {}) const {
    std::size_t n = 0;
    for (transfer const& t : *this)
      if (t.kind == kind && (axis.empty() || t.axis.view() == axis)) n += t.count;
    return n;
  }
  /// Bytes moved by calls of `kind` (all axes when `axis` is empty).
  [[nodiscard]] constexpr std::size_t bytes(transfer_kind kind, std::string_view axis = {}) const {
    std::size_t n = 0;
    for (transfer const& t : *this)
      if (t.kind == kind && (axis.empty() || t.axis.view() == axis)) n += t.count * t.bytes;
    return n;
  }
  /// Calls of every kind.
  [[nodiscard]] constexpr std::size_t calls() const {
    std::size_t n = 0;
    for (transfer const& t : *this) n += t.count;
    return n;
  }

  /// The same entries in the same order.
  template <std::size_t N>
  [[nodiscard]] constexpr bool operator==(transfer_list<N> const& other) const {
    return std::equal(begin(), end(), other.begin(), other.end());
  }
  /// One entry per line.
  friend std::ostream& operator<<(std::ostream& out, transfer_list const& list) {
    for (transfer const& t : list) out << "  " << t << '\n';
    return out;
  }

 private:
  static void throw_full();
  std::array<transfer, Capacity> items_{};
  std::size_t size_ = 0;
};

template <std::size_t Capacity>
void transfer_list<Capacity>::throw_full() {
  throw std::length_error("shardwise::transfer_list: more runs of transfers than its capacity; use a larger one");
}

}  // namespace shardwise
