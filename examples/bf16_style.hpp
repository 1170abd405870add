#pragma once
// A parallel style written outside the library: column-wise like ColwiseParallel on a sequence-parallel input,
// but its input all-gather runs in bfloat16 (half the bytes of fp32), and its output stays cut by features. A
// style says four things (sw::linear_style): its layouts, how the weight is cut, and its mover, which runs some
// moves its own way and states what they transfer. tests/cases/custom_style_cases.hpp trains a block with it.
#include <Eigen/Core>
#include <cstddef>
#include <shardwise/nn.hpp>
#include <type_traits>

namespace bf16_style {

namespace sw = shardwise;

/// Gathers a sequence-cut activation in bfloat16; every other move is the library's.
struct bf16_gather_mover {
  template <class From, class To>
  static constexpr bool gathers_sequence = std::is_same_v<From, sw::Shard<0>> && std::is_same_v<To, sw::Replicate>;

  template <class From, class To, class T>
  static sw::nn::matrix<T> move(sw::nn::group<T> const& group, sw::nn::matrix<T> const& x) {
    if constexpr (gathers_sequence<From, To>) {
      sw::nn::matrix<Eigen::bfloat16> const mine =
          x.unaryExpr([](T v) { return Eigen::bfloat16(static_cast<float>(v)); });
      sw::nn::matrix<Eigen::bfloat16> all;
      group.all_gather_bf16(mine, all, 0);
      return all.unaryExpr([](Eigen::bfloat16 v) { return static_cast<T>(static_cast<float>(v)); });
    } else {
      return sw::layout_engine::move<From, To, T>(group, x);
    }
  }

  /// What move<From, To> transfers on a [rows, cols] activation: the cost model's view of the same move.
  template <class From, class To>
  static constexpr void add_cost(sw::transfer_list<>& list, std::size_t rows, std::size_t cols, std::size_t element,
                                 sw::cost_inputs const& s) {
    if constexpr (gathers_sequence<From, To>)
      list.add(sw::transfer_kind::all_gather, s.tp_axis, s.local_tokens() * cols * sizeof(Eigen::bfloat16));
    else
      sw::layout_engine::add_cost<From, To>(list, rows, cols, element, s);
  }
};

/// The style: input cut along the sequence, weight cut by output features, output cut by features.
struct Bf16GatherColwise {
  using input_layouts = sw::Shard<0>;
  using output_layouts = sw::Shard<-1>;
  using weight_placement = sw::Shard<0>;
  using mover = bf16_gather_mover;
};

}  // namespace bf16_style

/// Its name in run-time messages ("Bf16GatherColwise at \"w1\": ...").
template <>
inline constexpr std::string_view shardwise::style_name<bf16_style::Bf16GatherColwise> = "Bf16GatherColwise";
