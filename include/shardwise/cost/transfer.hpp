#pragma once
// What moves between ranks, as values: a collective or point-to-point transfer (kind, mesh axis, bytes, how
// many times in a row) and an ordered list of them. The same types hold a plan's predicted communication
// (constexpr, sw::cost) and what a counting mesh recorded on a run (sw::counting), so the two compare with ==.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <iterator>
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

namespace detail {
/// Stored entries [first, last) of a transfer_list, repeated `times` times in a row.
struct transfer_repeat {
  std::size_t first = 0;
  std::size_t last = 0;
  std::size_t times = 1;
};
/// A place in a transfer_list's flat sequence: a stored entry, the repetition of its group (0 outside one) and
/// the first group that ends after it.
struct transfer_cursor {
  std::size_t index = 0;
  std::size_t rep = 0;
  std::size_t group = 0;
};
}  // namespace detail

/// An ordered list of transfers in which identical calls in a row are one entry with a count; constexpr. What it
/// shows (iteration, size, [], ==, <<) is that flat merged sequence; what it stores is compact: a list appended
/// `times` times (append(list, times)) is stored once with a repeat group, so a model's layers cost one block's
/// entries. Room for Capacity stored entries; each repeat group spans two or more of them, so Capacity / 2 groups
/// always suffice. Storing beyond it is a compile error in a constant expression, an exception at run time.
template <std::size_t Capacity = 48>
class transfer_list {
 public:
  class iterator;

  constexpr transfer_list() = default;

  /// Appends `t`, merging it into the last entry when it is the same call (and not inside a repeat group).
  constexpr transfer_list& add(transfer const& t) {
    if (t.count == 0) return *this;
    if (size_ > 0 && !last_in_group() && items_[size_ - 1].same_call(t))
      items_[size_ - 1].count += t.count;
    else
      push(t);
    return *this;
  }
  /// Appends `kind` on `axis` of `bytes`, `count` times.
  constexpr transfer_list& add(transfer_kind kind, axis_label axis, std::size_t bytes, std::size_t count = 1) {
    return add(transfer{kind, axis, bytes, count});
  }
  /// Appends every entry of `other`, in order (its repeat groups kept).
  template <std::size_t N>
  constexpr transfer_list& append(transfer_list<N> const& other) {
    if (other.size_ == 0) return *this;
    if constexpr (N == Capacity)
      if (&other == this) return append(transfer_list(other));  // it would grow as it is read
    if (other.group_count_ > 0 && other.groups_[0].first == 0)
      push(other.items_[0]);
    else
      add(other.items_[0]);               // may merge into this list's last entry
    std::size_t const shift = size_ - 1;  // where other's entry 0 landed
    for (std::size_t i = 1; i < other.size_; ++i) push(other.items_[i]);
    for (std::size_t g = 0; g < other.group_count_; ++g) {
      detail::transfer_repeat const& r = other.groups_[g];
      push_group({r.first + shift, r.last + shift, r.times});
    }
    return *this;
  }
  /// Appends `other` `times` times: its entries once and a repeat group. An `other` with repeat groups of its own
  /// is appended `times` times instead (groups do not nest).
  template <std::size_t N>
  constexpr transfer_list& append(transfer_list<N> const& other, std::size_t times) {
    if (times == 0 || other.size_ == 0) return *this;
    if constexpr (N == Capacity)
      if (&other == this) return append(transfer_list(other), times);
    if (times == 1 || other.group_count_ > 0) {
      for (std::size_t i = 0; i < times; ++i) append(other);
    } else if (other.size_ == 1) {
      transfer t = other.items_[0];
      t.count *= times;
      add(t);
    } else {
      std::size_t const first = size_;
      for (std::size_t i = 0; i < other.size_; ++i) push(other.items_[i]);
      push_group({first, size_, times});
    }
    return *this;
  }

  /// Stores the entries added since it held `from` (its stored() before a call) as one more repetition of the
  /// entries just before them, when they repeat them: a module called again on the same shapes (a model's next
  /// block) stores nothing new. What is stored expands to the same flat sequence; only less is stored.
  constexpr transfer_list& fold_repeat(std::size_t from) {
    std::size_t const n = size_ - from;
    if (n < 2 || from < n) return *this;  // one entry merges by itself; no room before for a repetition
    detail::transfer_repeat* const last = group_count_ > 0 ? &groups_[group_count_ - 1] : nullptr;
    if (last && last->last > from) return *this;  // the new entries hold a repeat group of their own
    bool const whole_group = last && last->first == from - n && last->last == from;
    if ((last && last->last > from - n && !whole_group) ||
        !std::equal(items_.begin() + static_cast<std::ptrdiff_t>(from - n),
                    items_.begin() + static_cast<std::ptrdiff_t>(from),
                    items_.begin() + static_cast<std::ptrdiff_t>(from)))
      return *this;
    size_ = from;
    if (whole_group)
      ++last->times;
    else
      push_group({from - n, from, 2});
    return *this;
  }

  /// Empties the list.
  constexpr void clear() { size_ = 0, group_count_ = 0; }

  /// Entries (runs of identical calls) of the flat sequence; walks it.
  [[nodiscard]] constexpr std::size_t size() const {
    std::size_t n = 0;
    for (iterator it = begin(); it != end(); ++it) ++n;
    return n;
  }
  [[nodiscard]] constexpr bool empty() const { return size_ == 0; }  ///< No transfer at all.
  /// Entries stored (a repeat group's once), at most Capacity.
  [[nodiscard]] constexpr std::size_t stored() const { return size_; }
  /// Entry i of the flat sequence; walks to it.
  [[nodiscard]] constexpr transfer operator[](std::size_t i) const {
    iterator it = begin();
    for (; i > 0; --i) ++it;
    return *it;
  }
  [[nodiscard]] constexpr iterator begin() const { return iterator(this, {}); }  ///< First entry.
  /// Past the last entry.
  [[nodiscard]] constexpr iterator end() const { return iterator(this, {size_, 0, group_count_}); }

  /// Calls of `kind` (all axes when `axis` is empty).
  [[nodiscard]] constexpr std::size_t calls(transfer_kind kind, std::string_view axis = {}) const {
    return sum([&](transfer const& t) { return t.kind == kind && matches(t, axis) ? t.count : 0; });
  }
  /// Bytes moved by calls of `kind` (all axes when `axis` is empty).
  [[nodiscard]] constexpr std::size_t bytes(transfer_kind kind, std::string_view axis = {}) const {
    return sum([&](transfer const& t) { return t.kind == kind && matches(t, axis) ? t.count * t.bytes : 0; });
  }
  /// Calls of every kind.
  [[nodiscard]] constexpr std::size_t calls() const {
    return sum([](transfer const& t) { return t.count; });
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
  template <std::size_t>
  friend class transfer_list;

  static constexpr bool matches(transfer const& t, std::string_view axis) {
    return axis.empty() || t.axis.view() == axis;
  }
  // The last stored entry is inside a repeat group: merging into it would change every repetition.
  [[nodiscard]] constexpr bool last_in_group() const {
    return group_count_ > 0 && groups_[group_count_ - 1].last == size_;
  }
  constexpr void push(transfer const& t) {
    if (size_ == Capacity) throw_full();
    items_[size_++] = t;
  }
  constexpr void push_group(detail::transfer_repeat const& r) {
    if (group_count_ == groups_.size()) throw_full();  // unreachable: a group spans two or more entries
    groups_[group_count_++] = r;
  }
  // f(entry) summed over the flat sequence, each stored entry weighted by its group's repetitions.
  template <class F>
  constexpr std::size_t sum(F f) const {
    std::size_t n = 0, g = 0;
    for (std::size_t i = 0; i < size_; ++i) {
      while (g < group_count_ && groups_[g].last <= i) ++g;
      bool const grouped = g < group_count_ && groups_[g].first <= i;
      n += (grouped ? groups_[g].times : 1) * f(items_[i]);
    }
    return n;
  }
  // Moves `at` to the next stored entry of the flat sequence, back to its group's first at a repetition's end.
  constexpr void step(detail::transfer_cursor& at) const {
    ++at.index;
    if (at.group == group_count_ || at.index != groups_[at.group].last) return;
    if (++at.rep < groups_[at.group].times) {
      at.index = groups_[at.group].first;
    } else {
      at.rep = 0;
      ++at.group;
    }
  }
  // The flat merged entry starting at `at` into `run`; returns where the next one starts.
  constexpr detail::transfer_cursor run_at(detail::transfer_cursor at, transfer& run) const {
    run = items_[at.index];
    step(at);
    for (; at.index < size_ && items_[at.index].same_call(run); step(at)) run.count += items_[at.index].count;
    return at;
  }

  static void throw_full();
  std::array<transfer, Capacity> items_{};
  std::array<detail::transfer_repeat, Capacity / 2> groups_{};
  std::size_t size_ = 0;
  std::size_t group_count_ = 0;
};

/// A forward iterator over a transfer_list's flat merged sequence: it expands repeat groups and merges identical
/// calls in a row as it goes, across groups and their repetitions. Dereferencing gives the entry by value.
template <std::size_t Capacity>
class transfer_list<Capacity>::iterator {
 public:
  using value_type = transfer;                         ///< An entry.
  using reference = transfer;                          ///< Entries are made on the fly.
  using difference_type = std::ptrdiff_t;              ///< A distance in entries.
  using iterator_concept = std::forward_iterator_tag;  ///< Multi-pass.
  using iterator_category = std::input_iterator_tag;   ///< Not a reference: a C++17 input iterator.

  constexpr iterator() = default;
  [[nodiscard]] constexpr transfer operator*() const { return run_; }  ///< The entry here.
  /// The next entry.
  constexpr iterator& operator++() {
    at_ = next_;
    load();
    return *this;
  }
  /// The next entry; returns this one.
  constexpr iterator operator++(int) {
    iterator const here = *this;
    ++*this;
    return here;
  }
  /// At the same entry (of the same list).
  friend constexpr bool operator==(iterator const& a, iterator const& b) {
    return a.at_.index == b.at_.index && a.at_.rep == b.at_.rep;
  }

 private:
  friend class transfer_list;
  constexpr iterator(transfer_list const* list, detail::transfer_cursor at) : list_(list), at_(at) { load(); }
  constexpr void load() {
    if (at_.index < list_->size_) next_ = list_->run_at(at_, run_);
  }

  transfer_list const* list_ = nullptr;
  detail::transfer_cursor at_;
  detail::transfer_cursor next_;
  transfer run_;
};

template <std::size_t Capacity>
void transfer_list<Capacity>::throw_full() {
  throw std::length_error(
      "shardwise::transfer_list: more stored entries than its Capacity (repeats are stored once); pass a larger "
      "Capacity where the list is made (llama_step_cost<T, Plan, Capacity>, pipeline_step_cost<Capacity>)");
}

}  // namespace shardwise
