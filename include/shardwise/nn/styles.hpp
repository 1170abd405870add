#pragma once
// Parallel styles: small tag types whose template parameters mirror the keyword arguments of PyTorch's
// torch.distributed.tensor.parallel styles, with the same defaults. Activations are [tokens, features]
// matrices, so the sequence dimension is 0 and the feature dimension is -1.
#include <type_traits>

#include "shardwise/placement/placement.hpp"

namespace shardwise {

/// Linear: weight cut by output features (rows of [out, in]), bias likewise; the input is made Replicate and
/// the output comes out Shard<-1>. Embedding: the table cut by embedding columns.
template <class InputLayouts = Replicate, class OutputLayouts = Shard<-1>>
struct ColwiseParallel {
  using input_layouts = InputLayouts;
  using output_layouts = OutputLayouts;
};

/// Linear: weight cut by input features, bias replicated; the input is Shard<-1>, the partial output is
/// reduced to OutputLayouts (Replicate: all-reduce; Shard<0>: reduce-scatter over the sequence).
/// Embedding: the table cut by vocabulary (masked lookup, then the reduction).
template <class InputLayouts = Shard<-1>, class OutputLayouts = Replicate>
struct RowwiseParallel {
  using input_layouts = InputLayouts;
  using output_layouts = OutputLayouts;
};

/// Norms on activations cut along the sequence: weights replicated, their gradients partial until reduced.
template <int SequenceDim = 0>
struct SequenceParallel {
  static_assert(SequenceDim == 0,
                "shardwise::SequenceParallel: activations are [tokens, features]; the sequence "
                "dimension is 0");
  using input_layouts = Shard<SequenceDim>;
  using output_layouts = Shard<SequenceDim>;
};

/// Redistributes a module's input from InputLayouts to DesiredInputLayouts (one placement: the module takes
/// one activation).
template <class InputLayouts, class DesiredInputLayouts>
struct PrepareModuleInput {
  using input_layouts = InputLayouts;
  using desired_input_layouts = DesiredInputLayouts;
};

/// Redistributes a module's output from OutputLayouts to DesiredOutputLayouts.
template <class OutputLayouts, class DesiredOutputLayouts>
struct PrepareModuleOutput {
  using output_layouts = OutputLayouts;
  using desired_output_layouts = DesiredOutputLayouts;
};

template <class InputLayouts, class DesiredInputLayouts, class OutputLayouts, class DesiredOutputLayouts>
struct PrepareModuleInputOutput {
  using input_layouts = InputLayouts;
  using desired_input_layouts = DesiredInputLayouts;
  using output_layouts = OutputLayouts;
  using desired_output_layouts = DesiredOutputLayouts;
};

template <class S>
inline constexpr bool is_colwise_v = false;
template <class I, class O>
inline constexpr bool is_colwise_v<ColwiseParallel<I, O>> = true;
template <class S>
inline constexpr bool is_rowwise_v = false;
template <class I, class O>
inline constexpr bool is_rowwise_v<RowwiseParallel<I, O>> = true;
template <class S>
inline constexpr bool is_sequence_parallel_v = false;
template <int D>
inline constexpr bool is_sequence_parallel_v<SequenceParallel<D>> = true;

}  // namespace shardwise
