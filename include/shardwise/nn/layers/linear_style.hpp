#pragma once
// What a style must say to shard a Linear, in one place. A style names the layout its Linear takes and gives,
// how the weight is cut, and the mover that carries activations between layouts; the Linear derives everything
// else from those: what its product reads and gives, the layouts of its gradients, where the bias goes, the
// collectives of its forward and backward (each the conjugate of the other) and their cost. No layer branches on
// which style it has, so a style written in user code (tests/test_custom_style.cpp) works like the library's.
#include <concepts>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/layers/styles.hpp"
#include "shardwise/nn/redistribute.hpp"
#include "shardwise/plan/plan.hpp"

namespace shardwise {

/// A style a Linear can take: the layouts its input arrives in and its output leaves in (Replicate, Shard<0>
/// for the sequence, Shard<-1> for the features), how the weight [out, in] is cut over tp (Shard<0>: by output
/// rows, as ColwiseParallel; Shard<1>: by input columns, as RowwiseParallel; Replicate) and its mover
/// (sw::layout_engine, or one of its own).
template <class S>
concept linear_style =
    requires {
      typename S::input_layouts;
      typename S::output_layouts;
      typename S::weight_placement;
      typename S::mover;
    } && (std::is_same_v<detail::normalize_2d_t<typename S::weight_placement>, Shard<0>> ||
          std::is_same_v<detail::normalize_2d_t<typename S::weight_placement>, Shard<1>> ||
          std::is_same_v<typename S::weight_placement, Replicate>);

/// The style of a Linear the plan does not name: whole weight, whole activations, nothing moved.
struct unsharded_linear {
  using input_layouts = Replicate;     ///< The input: the whole activation.
  using output_layouts = Replicate;    ///< The output: the whole activation.
  using weight_placement = Replicate;  ///< The whole weight on every rank.
  using mover = layout_engine;         ///< Nothing moves, so the library's.
};

/// The name a Linear's run-time messages give its style; specialize it to name a style of your own.
template <class Style>
inline constexpr std::string_view style_name = "the plan's style";
template <class I, class O>
inline constexpr std::string_view style_name<ColwiseParallel<I, O>> = "ColwiseParallel";
template <class I, class O>
inline constexpr std::string_view style_name<RowwiseParallel<I, O>> = "RowwiseParallel";

namespace detail {

template <class Style>
using linear_style_t = std::conditional_t<std::is_same_v<Style, NoParallel>, unsharded_linear, Style>;

/// The layouts of a Linear under style S, all derived from S's input, output and weight placement.
template <class S>
struct linear_layouts {
  using in = normalize_2d_t<typename S::input_layouts>;    ///< The input, as it arrives.
  using out = normalize_2d_t<typename S::output_layouts>;  ///< The output, as it leaves.
  using weight = normalize_2d_t<typename S::weight_placement>;
  static constexpr bool cut_rows = std::is_same_v<weight, Shard<0>>;  // output features: ColwiseParallel
  static constexpr bool cut_cols = std::is_same_v<weight, Shard<1>>;  // input features: RowwiseParallel
  /// What the product x W^T reads (this rank's input columns under a column cut, else the whole input) and
  /// gives (this rank's output columns, a partial sum over the input columns, or the whole output).
  using product_in = std::conditional_t<cut_cols, Shard<1>, Replicate>;
  using product_out = std::conditional_t<cut_rows, Shard<1>, std::conditional_t<cut_cols, Partial<Sum>, Replicate>>;
  /// The gradients at the product: the whole output gradient where the output was a sum, and the input
  /// gradient as a partial sum over this rank's output rows under a row cut.
  using product_out_grad = std::conditional_t<cut_cols, Replicate, product_out>;
  using product_in_grad = std::conditional_t<cut_rows, Partial<Sum>, product_in>;
  /// A partial input gradient of a replicated input is left Partial<Sum>: reduced once where it meets a layout
  /// (the next layer back, a module boundary) — one reduction for wq, wk and wv together.
  static constexpr bool input_grad_left_partial = cut_rows && std::is_same_v<in, Replicate>;
  using input_grad = std::conditional_t<input_grad_left_partial, Partial<Sum>, in>;
  /// The bias follows the output rows; under a column cut it is whole, added once after the reduction.
  using bias = std::conditional_t<cut_rows, Shard<0>, Replicate>;
  static constexpr bool bias_after_output = cut_cols;
};

/// The library's styles keep PyTorch's rules for a Linear's layouts (any other style: what its mover can move).
template <class S>
inline constexpr bool linear_layouts_allowed = true;
template <class I, class O>
inline constexpr bool linear_layouts_allowed<ColwiseParallel<I, O>> = [] {
  using in = normalize_2d_t<I>;
  using out = normalize_2d_t<O>;
  static_assert(std::is_same_v<in, Replicate> || std::is_same_v<in, Shard<0>>,
                "shardwise::ColwiseParallel on a Linear: input_layouts must be Replicate or Shard<0> (sequence)");
  static_assert(std::is_same_v<out, Shard<1>> || std::is_same_v<out, Replicate>,
                "shardwise::ColwiseParallel on a Linear: output_layouts must be Shard<-1> or Replicate");
  return true;
}();
template <class I, class O>
inline constexpr bool linear_layouts_allowed<RowwiseParallel<I, O>> = [] {
  using in = normalize_2d_t<I>;
  using out = normalize_2d_t<O>;
  static_assert(std::is_same_v<in, Shard<1>> || std::is_same_v<in, Replicate>,
                "shardwise::RowwiseParallel on a Linear: input_layouts must be Shard<-1> or Replicate");
  static_assert(std::is_same_v<out, Replicate> || std::is_same_v<out, Shard<0>>,
                "shardwise::RowwiseParallel on a Linear: output_layouts must be Replicate or Shard<0> (sequence)");
  return true;
}();

/// On an Embedding the library's styles keep their output rules.
template <class S>
inline constexpr bool embedding_layouts_allowed = true;
template <class I, class O>
inline constexpr bool embedding_layouts_allowed<ColwiseParallel<I, O>> = [] {
  using out = normalize_2d_t<O>;
  static_assert(std::is_same_v<out, Shard<1>> || std::is_same_v<out, Replicate>,
                "shardwise::ColwiseParallel on an Embedding: output_layouts must be Shard<-1> or Replicate");
  return true;
}();
template <class I, class O>
inline constexpr bool embedding_layouts_allowed<RowwiseParallel<I, O>> = [] {
  using out = normalize_2d_t<O>;
  static_assert(std::is_same_v<out, Replicate> || std::is_same_v<out, Shard<0>>,
                "shardwise::RowwiseParallel on an Embedding: output_layouts must be Replicate or Shard<0>");
  return true;
}();

}  // namespace detail
}  // namespace shardwise
