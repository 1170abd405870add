#pragma once
// A layer's sizes as one value: what its constructor takes and what its parameter walk for the cost model
// reads. A module states its children's shapes once (a static constexpr shardwise_shapes), builds its children
// from them, and sw::parameter_costs walks the same shapes with the children's types at compile time, so the
// cost model's list of parameters cannot drift from the model (docs/history/design-issue-34.md, step 6).
#include <cstddef>

namespace shardwise {

/// A Linear's sizes: `in` -> `out` features, with a bias or not; `copies`: how many times parallelize repeats
/// each block of its output rows (key-value heads under kv_size_multiplier; 1 when built).
struct linear_shape {
  std::size_t in = 0;      ///< Input features.
  std::size_t out = 0;     ///< Output features (before parallelize repeats any).
  bool bias = true;        ///< Whether it has a bias.
  std::size_t copies = 1;  ///< How many times parallelize repeats each block of output rows.
};

/// An Embedding's sizes: `rows` entries (the vocabulary) of `cols` features.
struct embedding_shape {
  std::size_t rows = 0;  ///< Entries: the vocabulary (before any padding for tp).
  std::size_t cols = 0;  ///< Features per entry.
};

/// A norm's size: its features.
struct norm_shape {
  std::size_t features = 0;  ///< Features normalized.
};

/// The shape of a repeated child (a vector or slice of blocks: `count` of them) or of a child that may hold no
/// parameters of its own (an optional one, a tied output: count 0 or 1), each of shape `each`.
template <class Shape>
struct repeated_shape {
  std::size_t count = 0;  ///< How many elements (0 or 1 for an optional or tied child).
  Shape each{};           ///< Each element's shape.
};

template <class Shape>
repeated_shape(std::size_t, Shape) -> repeated_shape<Shape>;

/// `shape` once when `present`, else not at all: an optional child, or a layer whose weight is another's (tied).
template <class Shape>
constexpr repeated_shape<Shape> only_if(bool present, Shape const& shape) {
  return {present ? std::size_t{1} : std::size_t{0}, shape};
}

}  // namespace shardwise
