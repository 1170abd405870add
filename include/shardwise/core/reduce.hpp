#pragma once
// Element-wise reductions shared by every backend, so each one combines values the same way.
#include <cstddef>

#include "shardwise/placement/placement.hpp"

namespace shardwise::detail {

template <op_kind Op, class T>
[[nodiscard]] inline T combine(T a, T b) {
  if constexpr (Op == op_kind::sum || Op == op_kind::avg)
    return static_cast<T>(a + b);
  else if constexpr (Op == op_kind::max)
    return b > a ? b : a;
  else
    return b < a ? b : a;
}

/// Calls fn(std::integral_constant-like tag) with the op as a compile-time value.
template <class Fn>
decltype(auto) dispatch_op(op_kind op, Fn&& fn) {
  switch (op) {
    case op_kind::sum:
      return fn.template operator()<op_kind::sum>();
    case op_kind::avg:
      return fn.template operator()<op_kind::avg>();
    case op_kind::max:
      return fn.template operator()<op_kind::max>();
    default:
      return fn.template operator()<op_kind::min>();
  }
}

/// After a sum over `ranks` contributions, turns it into the average.
template <class T>
void divide_by_ranks(T* data, std::size_t n, int ranks) {
  T const divisor = static_cast<T>(ranks);
  for (std::size_t i = 0; i < n; ++i) data[i] = static_cast<T>(data[i] / divisor);
}

}  // namespace shardwise::detail
