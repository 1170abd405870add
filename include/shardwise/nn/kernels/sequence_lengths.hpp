#pragma once
// How a batch's rows split into sequences for attention: each sequence a run of consecutive rows that attends
// causally within itself, its positions counted from 0 at its first row. Sequences of one length (a batch of
// rows), or lengths given one by one (documents packed into a row, as flash-attention's varlen kernels and
// transformers' packed position_ids take them).
#include <algorithm>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"

namespace shardwise {

/// The sequences of a batch's rows, in order. `every(n)`: whole sequences of n rows, as many as the rows make;
/// `{5, 9, 2}`: a sequence of 5 rows, then 9, then 2 (no padding between them). A default-constructed one is
/// empty: a model reads it as "whole sequences of the config's length".
class sequence_lengths {
 public:
  constexpr sequence_lengths() = default;
  /// Sequences of these lengths, in row order.
  constexpr sequence_lengths(std::initializer_list<std::size_t> lengths) : lengths_(lengths) {}
  /// Sequences of these lengths, in row order.
  constexpr explicit sequence_lengths(std::vector<std::size_t> lengths) : lengths_(std::move(lengths)) {}

  /// Whole sequences of `length` rows each.
  static constexpr sequence_lengths every(std::size_t length) {
    sequence_lengths s;
    s.every_ = length;
    return s;
  }

  /// Whether none was given (default-constructed).
  [[nodiscard]] constexpr bool empty() const { return every_ == 0 && lengths_.empty(); }
  /// Whether the sequences all have one length (every(n)).
  [[nodiscard]] constexpr bool uniform() const { return every_ != 0; }
  /// The lengths given one by one (empty for every(n)).
  [[nodiscard]] constexpr std::vector<std::size_t> const& lengths() const { return lengths_; }
  /// The longest sequence: what the attention's panels and the rotary tables are sized to.
  [[nodiscard]] constexpr std::size_t longest() const {
    return uniform() ? every_ : lengths_.empty() ? 0 : *std::max_element(lengths_.begin(), lengths_.end());
  }

  /// Calls f(first_row, length) for each sequence of a batch of `rows` rows (check() them first).
  template <class F>
  constexpr void for_each(std::size_t rows, F&& f) const {
    if (uniform()) {
      for (std::size_t first = 0; first < rows; first += every_) f(first, std::min(every_, rows - first));
      return;
    }
    std::size_t first = 0;
    for (std::size_t n : lengths_) f(first, n), first += n;
  }

  /// Throws, naming `where`, unless these sequences make exactly `rows` rows, none empty, none longer than
  /// `capacity` (0: any length).
  void check(std::size_t rows, std::string_view where, std::size_t capacity = 0) const {
    if (empty()) shardwise::raise(where, ": no sequence lengths given; give sequence_lengths::every(n) or each length");
    if (uniform() && rows % every_ != 0)
      shardwise::raise(where, ": ", rows, " rows are not whole sequences of ", every_,
                       "; give a batch of whole sequences, or each sequence's length");
    std::size_t total = 0;
    for (std::size_t i = 0; i < lengths_.size(); ++i) {
      if (lengths_[i] == 0)
        shardwise::raise(where, ": sequence ", i, " has 0 rows; leave empty sequences out of sequence_lengths");
      if (lengths_[i] > std::numeric_limits<std::size_t>::max() - total)
        shardwise::raise(where, ": the sequence lengths overflow a row count; check them");
      total += lengths_[i];
    }
    if (!uniform() && total != rows)
      shardwise::raise(where, ": the sequence lengths add up to ", total, " rows but the batch has ", rows,
                       "; give one length per sequence, in row order, that add up to the rows");
    if (capacity != 0 && longest() > capacity)
      shardwise::raise(where, ": a sequence of ", longest(), " rows is longer than the model's capacity of ", capacity,
                       " positions (config().sequence); cut it, or build the model with a longer one");
  }

  /// Equal when they describe the same sequences the same way (every(n), or the same lengths).
  friend constexpr bool operator==(sequence_lengths const&, sequence_lengths const&) = default;

 private:
  std::size_t every_ = 0;
  std::vector<std::size_t> lengths_;
};

}  // namespace shardwise
