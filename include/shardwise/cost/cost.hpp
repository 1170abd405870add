#pragma once
// The cost of a plan as a value: what a layer or module holds on one rank and what it sends, in order, per
// forward and per backward — constexpr when the sizes are, so that user code can static_assert on it. Each
// built-in layer declares its own (Linear::shardwise_cost); a module joins by declaring one that composes its
// children's in the order its forward and backward call them (the Llama blocks do). sw::counting records the
// same lists on a real run, so a test proves each prediction entry for entry.
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/core/show.hpp"
#include "shardwise/cost/context_inputs.hpp"
#include "shardwise/cost/transfer.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise {

/// The sizes a cost is computed for: the tokens of one microbatch (every sequence, all of them, not this rank's
/// piece; under context parallelism, this cp rank's tokens of every sequence), the tensor-parallel size, this
/// rank's place on it (uneven pieces differ by rank), the axis' name, and the context-parallel axis.
struct cost_inputs {
  std::size_t tokens = 0;           ///< Rows of the whole activation: sequences x sequence length.
  std::size_t tp = 1;               ///< Ranks on the tensor-parallel axis.
  std::size_t tp_rank = 0;          ///< This rank's coordinate on it.
  std::string_view tp_axis = "tp";  ///< The axis' name, as the mesh calls it.
  context_inputs cp{};              ///< The context-parallel axis (ranks 1: none).

  /// This rank's rows of a [tokens, ...] activation cut along the tokens (torch.chunk's pieces).
  [[nodiscard]] constexpr std::size_t local_tokens() const { return chunk_size(tokens, tp, tp_rank); }
};

/// What a layer or module costs on one rank: its communication per forward and per backward, in order, and the
/// bytes of its parameters, of their gradients and of what its forward keeps for its backward on this rank.
struct cost {
  transfer_list<> forward;           ///< The forward's transfers, in order.
  transfer_list<> backward;          ///< The backward's transfers, in order.
  std::size_t parameter_bytes = 0;   ///< This rank's parameters.
  std::size_t gradient_bytes = 0;    ///< Their gradients (as many: one per parameter element).
  std::size_t activation_bytes = 0;  ///< What one forward keeps for its backward (one microbatch in flight).
  /// The most its backward allocates at once beyond what it holds: its transients, for one microbatch. Not in
  /// bytes_per_rank (nothing holds them between passes); the planner adds the largest once per stage.
  std::size_t working_bytes = 0;

  /// Parameters, gradients and one microbatch's saved activations held on this rank.
  [[nodiscard]] constexpr std::size_t bytes_per_rank() const {
    return parameter_bytes + gradient_bytes + activation_bytes;
  }

  /// Adds a part that holds `other`'s parameters, gradients and saved activations (its backward's transients
  /// come one part at a time: the largest counts); its transfers are added by the caller, in the order the code
  /// runs them (forward in call order, backward as the backward calls them).
  constexpr cost& hold(cost const& other) {
    parameter_bytes += other.parameter_bytes;
    gradient_bytes += other.gradient_bytes;
    activation_bytes += other.activation_bytes;
    working_bytes = working_bytes > other.working_bytes ? working_bytes : other.working_bytes;
    return *this;
  }
};

/// One parameter as the costs that walk a model's parameters see it (sw::finish_gradients, optimizers), in the
/// order of sw::for_each_parameter: a model offers them through a static
/// `shardwise_parameter_costs(config, cost_inputs, fn)` that calls fn(parameter_cost) for each.
struct parameter_cost {
  std::size_t elements = 0;         ///< This rank's shard, in elements.
  std::size_t element_size = 4;     ///< Bytes per element.
  bool partial_gradient = false;    ///< Summed over tp by finish_gradients (a norm under SequenceParallel).
  std::size_t copies_elements = 0;  ///< Repeated blocks: elements finish_gradients all-reduces to sum the copies.
  std::size_t rows = 0;             ///< This rank's rows (dimension 0, which FSDP cuts over dp); 0: not given.
  bool cut_over_tp = false;         ///< Each tp rank holds a piece: wrap_min_params counts elements x tp.
};

/// The transfers of sw::finish_gradients on one rank, for the parameters `walk(fn)` visits in order: each Partial
/// gradient all-reduced over tp, each repeated block's copies summed by an all-reduce.
template <std::size_t Capacity = 48, class Walk>
constexpr transfer_list<Capacity> finish_gradients_cost(Walk&& walk, cost_inputs const& s) {
  transfer_list<Capacity> list;
  walk([&](parameter_cost const& p) {
    if (p.partial_gradient)
      list.add(transfer_kind::all_reduce, s.tp_axis, p.elements * p.element_size);
    else if (p.copies_elements != 0)
      list.add(transfer_kind::all_reduce, s.tp_axis, p.copies_elements * p.element_size);
  });
  return list;
}

namespace detail {
template <std::size_t Bytes, std::size_t Limit>
struct bytes_per_rank_exceed_limit;  // incomplete on purpose: the compile error spells both numbers
}  // namespace detail

/// A compile-time memory check that names both numbers when it fails:
/// static_assert(sw::fits_in_memory<sw::cost_of<Block>(config, inputs).bytes_per_rank(), 16ull << 30>()).
template <std::size_t Bytes, std::size_t Limit>
constexpr bool fits_in_memory() {
  static_assert(Bytes <= Limit,
                "shardwise::fits_in_memory: the plan holds more bytes per rank than the limit; shard further (a "
                "larger tp, FSDP) or raise the limit");
  if constexpr (Bytes > Limit) {
    using shown [[maybe_unused]] =
        decltype(detail::show_incomplete<detail::bytes_per_rank_exceed_limit<Bytes, Limit>>());
  }
  return Bytes <= Limit;
}

/// A module's or layer's declared cost: Node::shardwise_cost(args...), with a message when it declares none.
template <class Node, class... Args>
constexpr cost cost_of(Args const&... args) {
  constexpr bool declared = requires { Node::shardwise_cost(args...); };
  static_assert(declared,
                "shardwise::cost_of: this module declares no cost for these arguments; give it a static constexpr "
                "shardwise_cost(...) that composes its children's (see LlamaFeedForward)");
  if constexpr (declared)
    return Node::shardwise_cost(args...);
  else
    return {};
}

}  // namespace shardwise
