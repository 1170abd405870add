#pragma once
// The key-value cache of incremental decoding: per attention layer, the keys and values of every token a sequence
// has seen, for this rank's key-value heads only (a tensor-parallel attention caches the heads it computes), in
// storage allocated once for a fixed number of sequences and a capacity of positions each. A layer with a sliding
// window shorter than the capacity keeps only the window's last positions (a rolling buffer: position p in row
// p % window), as Mistral's reference implementation does: no query of that layer reads further back. A forward with
// the cache takes rows for several sequences at once, packed one sequence after the other (a prompt's tokens at
// prefill, one token per sequence at decode); kv_cache::append says where each sequence's rows go.
//
//   sw::kv_cache<float> cache(model.shardwise_kv_shape(), prompts, capacity);
//   sw::cache_step step = cache.append(sequences, new_tokens);  // reserves the positions
//   auto logits = model.forward(ids, step, cache);              // one row per entry: its last token's
#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise {

/// The sizes of a model's cache on one rank: layers, and per layer the key (and value) columns of this rank's
/// key-value heads (local heads x head_dim).
struct kv_cache_shape {
  std::size_t layers = 0;    ///< Attention layers.
  std::size_t columns = 0;   ///< Key columns per layer on this rank: its key-value heads x head_dim.
  std::size_t head_dim = 0;  ///< Width of one head.
  /// Each layer's sliding window (0: none), or empty: none anywhere. A window shorter than the cache's capacity
  /// makes that layer keep only its window's positions.
  std::vector<std::size_t> windows{};
  /// The positions layer `layer` keeps per sequence in a cache of `capacity`: its window when shorter, else all.
  [[nodiscard]] constexpr std::size_t kept_positions(std::size_t layer, std::size_t capacity) const {
    std::size_t const window = layer < windows.size() ? windows[layer] : 0;
    return window != 0 && window < capacity ? window : capacity;
  }
};

/// One sequence's rows in a forward with the cache: `count` new tokens at positions start .. start + count - 1.
struct cache_entry {
  std::size_t sequence = 0;  ///< Which of the cache's sequences.
  std::size_t start = 0;     ///< Tokens the sequence held before these: the first new token's position.
  std::size_t count = 0;     ///< New tokens (rows) of the sequence in this forward.
};

/// The rows of one forward with the cache: its entries, packed in order (entry 0's rows first), and the cache's
/// capacity per sequence (where sequence s's rows begin in a layer's storage: s x capacity).
struct cache_step {
  std::vector<cache_entry> entries{};  ///< The sequences of this forward and their new tokens.
  std::size_t capacity = 0;            ///< Positions per sequence in the cache.
  /// All rows of the forward: the entries' counts summed.
  [[nodiscard]] std::size_t rows() const {
    std::size_t n = 0;
    for (auto const& e : entries) n += e.count;
    return n;
  }
  /// The position of every row, in order (RoPE's and learned position embeddings' input).
  [[nodiscard]] std::vector<std::int64_t> positions() const {
    std::vector<std::int64_t> p;
    p.reserve(rows());
    for (auto const& e : entries)
      for (std::size_t i = 0; i < e.count; ++i) p.push_back(static_cast<std::int64_t>(e.start + i));
    return p;
  }
  /// The index of each entry's last row (whose logits predict the sequence's next token).
  [[nodiscard]] std::vector<Eigen::Index> last_rows() const {
    std::vector<Eigen::Index> last;
    std::size_t end = 0;
    for (auto const& e : entries) last.push_back(static_cast<Eigen::Index>((end += e.count) - 1));
    return last;
  }
};

namespace nn {
/// One attention layer's cache: keys and values [sequences x capacity, columns], sequence s in rows
/// [s x capacity, (s + 1) x capacity), row-major so that a token's keys of every local head are contiguous. With a
/// `window`, [sequences x window, columns]: sequence s keeps its last `window` positions, position p in row
/// s x window + p % window.
template <class T>
struct kv_layer {
  matrix<T> keys;          ///< The keys of every cached token.
  matrix<T> values;        ///< Their values.
  std::size_t window = 0;  ///< 0: every position kept; else the positions kept per sequence (a rolling buffer).
};
}  // namespace nn

/// The key-value cache of a model for `sequences` sequences of up to `capacity` tokens each (prompt and generated
/// tokens), allocated once: 2 x layers x columns x capacity x sequences elements of T on this rank.
template <class T>
class kv_cache {
 public:
  /// Allocates the cache (zeroed) for a model of `shape`; throws for a zero size or one too large to index.
  kv_cache(kv_cache_shape const& shape, std::size_t sequences, std::size_t capacity)
      : shape_(shape), capacity_(capacity), lengths_(sequences, 0) {
    if (shape.layers == 0 || shape.columns == 0 || sequences == 0 || capacity == 0)
      detail::fail("shardwise::kv_cache: ", shape.layers, " layers, ", shape.columns, " columns, ", sequences,
                   " sequences and a capacity of ", capacity, " tokens: every size must be positive");
    constexpr std::size_t limit = std::size_t{1} << 40;  // elements of one layer's keys
    if (sequences > limit / capacity || sequences * capacity > limit / shape.columns)
      detail::fail("shardwise::kv_cache: ", sequences, " sequences x ", capacity, " tokens x ", shape.columns,
                   " columns overflows a layer's storage; choose a smaller capacity or fewer sequences");
    if (!shape.windows.empty() && shape.windows.size() != shape.layers)
      detail::fail("shardwise::kv_cache: ", shape.windows.size(), " windows for ", shape.layers,
                   " layers; give one per layer (0: none), or none");
    layers_.resize(shape.layers);
    auto const cols = static_cast<Eigen::Index>(shape.columns);
    for (std::size_t i = 0; i < shape.layers; ++i) {
      std::size_t const kept = shape.kept_positions(i, capacity);
      auto const rows = static_cast<Eigen::Index>(sequences * kept);
      layers_[i].keys.setZero(rows, cols), layers_[i].values.setZero(rows, cols);
      layers_[i].window = kept < capacity ? kept : 0;
    }
  }

  /// Bytes a cache of these sizes holds on one rank: 2 x columns x sequences x sizeof(T) x the positions each
  /// layer keeps (the capacity, or its window when shorter).
  static constexpr std::size_t bytes_for(kv_cache_shape const& shape, std::size_t sequences, std::size_t capacity) {
    std::size_t positions = 0;
    for (std::size_t i = 0; i < shape.layers; ++i) positions += shape.kept_positions(i, capacity);
    return 2 * shape.columns * positions * sequences * sizeof(T);
  }
  /// The bytes this cache holds.
  [[nodiscard]] std::size_t bytes() const { return bytes_for(shape_, lengths_.size(), capacity_); }

  /// Reserves the next counts[i] positions of sequences[i] for a forward, and says where its rows go: the
  /// attention layers write those tokens' keys and values there. Throws, naming the sequence, for one that is not
  /// in the cache, given twice, or would pass the capacity.
  cache_step append(std::span<const std::size_t> sequences, std::span<const std::size_t> counts) {
    if (sequences.size() != counts.size())
      detail::fail("shardwise::kv_cache::append: ", sequences.size(), " sequences but ", counts.size(),
                   " counts; give one count of new tokens per sequence");
    cache_step step{{}, capacity_};
    std::vector<bool> seen(lengths_.size(), false);
    for (std::size_t i = 0; i < sequences.size(); ++i) {
      std::size_t const s = sequences[i];
      if (s >= lengths_.size() || seen[s])
        detail::fail("shardwise::kv_cache::append: sequence ", s, s < lengths_.size() ? " is given twice" : "",
                     s < lengths_.size() ? "" : " is not in the cache", " (it holds ", lengths_.size(),
                     " sequences); give each sequence at most once");
      if (counts[i] == 0 || counts[i] > capacity_ - lengths_[s])
        detail::fail("shardwise::kv_cache::append: sequence ", s, " holds ", lengths_[s], " of ", capacity_,
                     " tokens and cannot take ", counts[i],
                     " more; give at least one token and make the cache larger (its capacity)");
      seen[s] = true;
    }
    for (std::size_t i = 0; i < sequences.size(); ++i) {
      step.entries.push_back({sequences[i], lengths_[sequences[i]], counts[i]});
      lengths_[sequences[i]] += counts[i];
    }
    return step;
  }

  /// Empties one sequence (its slot takes a new prompt from position 0).
  void reset(std::size_t sequence) { lengths_.at(sequence) = 0; }
  /// Tokens sequence `s` holds.
  [[nodiscard]] std::size_t length(std::size_t s) const { return lengths_.at(s); }
  /// Positions per sequence.
  [[nodiscard]] std::size_t capacity() const { return capacity_; }
  /// Sequences the cache holds.
  [[nodiscard]] std::size_t sequences() const { return lengths_.size(); }
  /// Its sizes per rank.
  [[nodiscard]] kv_cache_shape const& shape() const { return shape_; }
  /// Attention layer i's keys and values; throws for a layer the cache does not have.
  nn::kv_layer<T>& layer(std::size_t i) {
    if (i >= layers_.size())
      detail::fail("shardwise::kv_cache::layer: layer ", i, " of a cache built for ", layers_.size(),
                   " layers; build the cache from the model's shardwise_kv_shape()");
    return layers_[i];
  }

 private:
  kv_cache_shape shape_;
  std::size_t capacity_;
  std::vector<std::size_t> lengths_;
  std::vector<nn::kv_layer<T>> layers_;
};

}  // namespace shardwise
