#pragma once
// Which collectives turn one layout into another, decided by constexpr functions over the placements, so
// for tensors of static rank the whole sequence is fixed at compile time (and can be static_assert-ed).
//
// Per mesh axis (design.md): Replicate -> Shard: local slice; Shard -> Replicate: all-gather;
// Shard<d> -> Shard<e>: all-to-all; Partial -> Replicate: all-reduce; Partial -> Shard: reduce-scatter;
// Replicate -> Partial: keep on one rank; Shard -> Partial: not a redistribution.
// When two mesh axes cut the same tensor dimension (in either layout), the inner pieces are gathered first (last axis
// first) and re-cut from the first axis on, because a chunk of a chunk depends on the order of the cuts.
#include <array>
#include <cstddef>

#include "shardwise/placement/placement.hpp"

namespace shardwise::detail {

enum class step_kind : unsigned char { slice, all_gather, all_to_all, all_reduce, reduce_scatter, keep_one, repartial };

struct redistribute_step {
  step_kind kind = step_kind::slice;
  std::size_t axis = 0;
  placement_value from{}, to{};
};

template <std::size_t K>
struct redistribute_plan {
  std::array<redistribute_step, 2 * K> steps{};
  std::size_t count = 0;
  bool valid = true;
  std::size_t invalid_axis = 0;  // when !valid: the axis that asks for Shard -> Partial

  constexpr void add(step_kind kind, std::size_t axis, placement_value from, placement_value to) {
    steps[count++] = {kind, axis, from, to};
  }
};

constexpr placement_value normalized(placement_value p, std::size_t rank) {
  if (p.kind == placement_kind::shard && p.dim < 0) p.dim += static_cast<int>(rank);
  return p;
}

constexpr bool dim_in_range(placement_value p, std::size_t rank) {
  if (p.kind != placement_kind::shard) return true;
  return p.dim >= -static_cast<int>(rank) && p.dim < static_cast<int>(rank);
}

/// Placements of the two layouts must already be normalized.
template <std::size_t K>
constexpr redistribute_plan<K> plan_redistribute(std::array<placement_value, K> const& from,
                                                 std::array<placement_value, K> const& to) {
  redistribute_plan<K> plan;
  auto shards = [](placement_value p, int d) { return p.kind == placement_kind::shard && p.dim == d; };
  // Dimension d is cut by more than one axis across the two layouts: the order of cuts matters there.
  auto nested = [&](int d) {
    std::size_t axes = 0;
    for (std::size_t i = 0; i < K; ++i) axes += (shards(from[i], d) || shards(to[i], d)) ? 1 : 0;
    return axes > 1;
  };
  // First axis at which the cuts of dimension d differ between the layouts (K if they agree).
  auto first_change = [&](int d) {
    for (std::size_t i = 0; i < K; ++i)
      if (shards(from[i], d) != shards(to[i], d)) return i;
    return K;
  };
  std::array<placement_value, K> current = from;
  for (std::size_t i = K; i-- > 0;) {
    placement_value const p = current[i];
    if (p.kind == placement_kind::shard && nested(p.dim) && i >= first_change(p.dim)) {
      plan.add(step_kind::all_gather, i, p, placement_value{});
      current[i] = placement_value{};
    }
  }
  for (std::size_t i = 0; i < K; ++i) {
    placement_value const p = current[i], q = to[i];
    if (p == q) continue;
    if (p.kind == placement_kind::replicate) {
      plan.add(q.kind == placement_kind::shard ? step_kind::slice : step_kind::keep_one, i, p, q);
    } else if (p.kind == placement_kind::shard) {
      if (q.kind == placement_kind::partial) {
        plan.valid = false;
        plan.invalid_axis = i;
        return plan;
      }
      plan.add(q.kind == placement_kind::shard ? step_kind::all_to_all : step_kind::all_gather, i, p, q);
    } else {
      plan.add(q.kind == placement_kind::replicate ? step_kind::all_reduce
               : q.kind == placement_kind::shard   ? step_kind::reduce_scatter
                                                   : step_kind::repartial,
               i, p, q);
    }
    current[i] = q;
  }
  return plan;
}

template <class L>
struct layout_values;
template <class... P>
struct layout_values<Layout<P...>> {
  static constexpr std::array<placement_value, sizeof...(P)> value{placement_value_of<P>()...};
};

}  // namespace shardwise::detail
