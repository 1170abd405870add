#pragma once
// Placements say how a tensor lives on one mesh axis; a Layout is one placement per mesh axis.
#include <cstddef>
#include <type_traits>

namespace shardwise {

/// Sharded along tensor dimension D on this mesh axis (negative D counts from the last dimension),
/// in pieces sized like torch.chunk: ceil(size / ranks) each, the last ones shorter or empty.
template <int D>
struct Shard {
  static constexpr int dim = D;  ///< The tensor dimension it is cut along (negative: from the last).
};

/// Every rank of the mesh axis holds the whole tensor.
struct Replicate {};

/// Reductions a partial tensor is waiting for.
struct Sum {};
/// The mean over the ranks.
struct Avg {};
/// The maximum over the ranks.
struct Max {};
/// The minimum over the ranks.
struct Min {};

/// Every rank holds a contribution; the tensor is the reduction (Op) of them over the mesh axis.
template <class Op = Sum>
struct Partial {
  using op = Op;  ///< The reduction: Sum, Avg, Max or Min.
};

/// One placement per mesh axis, in the mesh's axis order.
template <class... Placements>
struct Layout {
  static constexpr std::size_t size = sizeof...(Placements);  ///< The number of placements (mesh axes).
};

template <class T>
inline constexpr bool is_shard_v = false;
template <int D>
inline constexpr bool is_shard_v<Shard<D>> = true;

template <class T>
inline constexpr bool is_partial_v = false;
template <class Op>
inline constexpr bool is_partial_v<Partial<Op>> = true;

template <class T>
concept reduce_op =
    std::is_same_v<T, Sum> || std::is_same_v<T, Avg> || std::is_same_v<T, Max> || std::is_same_v<T, Min>;

template <class T>
concept placement = is_shard_v<T> || std::is_same_v<T, Replicate> || (is_partial_v<T> && reduce_op<typename T::op>);

template <class T>
inline constexpr bool is_layout_v = false;
template <class... P>
inline constexpr bool is_layout_v<Layout<P...>> = (placement<P> && ...);

template <class T>
concept layout = is_layout_v<T>;

namespace detail {

enum class placement_kind : unsigned char { replicate, shard, partial };
enum class op_kind : unsigned char { sum, avg, max, min };

/// A placement as a value, so layouts can be planned with constexpr functions.
struct placement_value {
  placement_kind kind = placement_kind::replicate;
  int dim = 0;  // for shard: normalized (non-negative) once the tensor rank is known
  op_kind op = op_kind::sum;
  constexpr bool operator==(placement_value const&) const = default;
};

template <reduce_op Op>
constexpr op_kind op_kind_of() {
  if constexpr (std::is_same_v<Op, Sum>)
    return op_kind::sum;
  else if constexpr (std::is_same_v<Op, Avg>)
    return op_kind::avg;
  else if constexpr (std::is_same_v<Op, Max>)
    return op_kind::max;
  else
    return op_kind::min;
}

template <placement P>
constexpr placement_value placement_value_of() {
  if constexpr (is_shard_v<P>)
    return {placement_kind::shard, P::dim, op_kind::sum};
  else if constexpr (is_partial_v<P>)
    return {placement_kind::partial, 0, op_kind_of<typename P::op>()};
  else
    return {};
}

}  // namespace detail
}  // namespace shardwise
