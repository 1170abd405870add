#pragma once
// Parallel styles: small tag types whose template parameters mirror the keyword arguments of PyTorch's
// torch.distributed.tensor.parallel styles, with the same defaults. Activations are [tokens, features]
// matrices, so the sequence dimension is 0 and the feature dimension is -1.
#include <type_traits>

#include "shardwise/placement/placement.hpp"

namespace shardwise {

struct layout_engine;  // nn/redistribute.hpp: the library's mover of activations between layouts

/// Linear: weight cut by output features (rows of [out, in]), bias likewise; the input is made Replicate and
/// the output comes out Shard<-1>. Embedding: the table cut by embedding columns.
template <class InputLayouts = Replicate, class OutputLayouts = Shard<-1>>
struct ColwiseParallel {
  using input_layouts = InputLayouts;    ///< The layout the input arrives in.
  using output_layouts = OutputLayouts;  ///< The layout the output leaves in.
  using weight_placement = Shard<0>;     ///< A Linear's weight [out, in]: cut by output features.
  using mover = layout_engine;           ///< Activations move the library's way (sw::redistribute's).
};

/// Linear: weight cut by input features, bias replicated; the input is Shard<-1>, the partial output is
/// reduced to OutputLayouts (Replicate: all-reduce; Shard<0>: reduce-scatter over the sequence).
/// Embedding: the table cut by vocabulary (masked lookup, then the reduction).
template <class InputLayouts = Shard<-1>, class OutputLayouts = Replicate>
struct RowwiseParallel {
  using input_layouts = InputLayouts;    ///< The layout the input arrives in.
  using output_layouts = OutputLayouts;  ///< The layout the output leaves in.
  using weight_placement = Shard<1>;     ///< A Linear's weight [out, in]: cut by input features.
  using mover = layout_engine;           ///< Activations move the library's way (sw::redistribute's).
};

/// Norms on activations cut along the sequence: weights replicated, their gradients partial until reduced.
template <int SequenceDim = 0>
struct SequenceParallel {
  static_assert(SequenceDim == 0,
                "shardwise::SequenceParallel: activations are [tokens, features]; the sequence "
                "dimension is 0");
  using input_layouts = Shard<SequenceDim>;   ///< The input arrives cut along the sequence.
  using output_layouts = Shard<SequenceDim>;  ///< The output leaves cut along the sequence.
};

/// Redistributes a module's input from InputLayouts to DesiredInputLayouts (one placement: the module takes
/// one activation).
template <class InputLayouts, class DesiredInputLayouts>
struct PrepareModuleInput {
  using input_layouts = InputLayouts;                 ///< The layout the input arrives in.
  using desired_input_layouts = DesiredInputLayouts;  ///< The layout the module receives it in.
  using mover = layout_engine;                        ///< Activations move the library's way.
};

/// Redistributes a module's output from OutputLayouts to DesiredOutputLayouts.
template <class OutputLayouts, class DesiredOutputLayouts>
struct PrepareModuleOutput {
  using output_layouts = OutputLayouts;                 ///< The layout the module's output comes out in.
  using desired_output_layouts = DesiredOutputLayouts;  ///< The layout it is passed on in.
  using mover = layout_engine;                          ///< Activations move the library's way.
};

/// PrepareModuleInput and PrepareModuleOutput on one module.
template <class InputLayouts, class DesiredInputLayouts, class OutputLayouts, class DesiredOutputLayouts>
struct PrepareModuleInputOutput {
  using input_layouts = InputLayouts;                   ///< The layout the input arrives in.
  using desired_input_layouts = DesiredInputLayouts;    ///< The layout the module receives it in.
  using output_layouts = OutputLayouts;                 ///< The layout the module's output comes out in.
  using desired_output_layouts = DesiredOutputLayouts;  ///< The layout it is passed on in.
  using mover = layout_engine;                          ///< Activations move the library's way.
};

namespace detail {
template <class S>
concept moves_module_input = requires {
  typename S::input_layouts;
  typename S::desired_input_layouts;
};
template <class S>
concept moves_module_output = requires {
  typename S::output_layouts;
  typename S::desired_output_layouts;
};

}  // namespace detail

/// A style a module's own plan entry can take, applied by sw::forward / sw::backward around the module: the
/// layout its input arrives in and the one the module receives it in (`input_layouts`, `desired_input_layouts`),
/// or those of its output (`output_layouts`, `desired_output_layouts`), or both; and its `mover`
/// (sw::layout_engine, or one of its own: sw::activation_mover), which runs the moves and states their cost.
/// PrepareModuleInput, PrepareModuleOutput and PrepareModuleInputOutput are three.
template <class S>
concept module_style =
    requires { typename S::mover; } && (detail::moves_module_input<S> || detail::moves_module_output<S>);

template <class S>
inline constexpr bool is_colwise_v = false;
template <class I, class O>
inline constexpr bool is_colwise_v<ColwiseParallel<I, O>> = true;

}  // namespace shardwise
