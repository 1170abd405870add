#pragma once
// Where each tensor of a model lies in a checkpoint of full tensors that another program writes or reads — Hugging
// Face transformers' names, Conv1D weights stored transposed, q, k and v fused into one tensor. A model declares
// this once (sw::transformers_llama_mapping, sw::transformers_gpt2_mapping) and the same mapping serves loading
// (sw::load_pretrained) and exporting (sw::consolidate with consolidate_options::mapping).
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace shardwise {

/// Where one model tensor comes from in the checkpoint.
struct tensor_source {
  std::string name;        ///< the file's tensor
  bool transpose = false;  ///< the file stores it transposed (GPT-2's Conv1D: [in, out]); no-op for a vector
  /// -1: the whole tensor; else the model tensor is [slice_start, slice_start + slice_size) along this dimension
  /// of the file's tensor after transposing (q, k or v of GPT-2's fused c_attn: slice_dim 0). A vector: 0.
  int slice_dim = -1;
  /// The slice's start and size along slice_dim, when slice_dim is not -1.
  /// @{
  std::uint64_t slice_start = 0, slice_size = 0;
  /// @}
  /// The fused tensor's size along slice_dim (GPT-2's c_attn: 3 x dim), or 0 when not given: written back by
  /// sw::consolidate, the slices must cover exactly that, so that a missing last slice is an error.
  std::uint64_t slice_of = 0;
  /// -1: the file's tensor is the model's (or holds it, sliced). Else the file's tensor stacks tensors of the model's
  /// along its first dimension (transformers' fused experts, gate_up_proj [experts, 2 x hidden, dim]) and the model
  /// tensor is its [stacked_index] (then sliced, if slice_dim says so, along the remaining dimensions); written by
  /// sw::consolidate when the model's tensors fill every index from 0.
  std::int64_t stacked_index = -1;
};

/// Model tensor name ("h.0.attn.wq.weight") -> its source, or std::nullopt when the checkpoint has none (the
/// tensor is then missing: an error when strict, reported and left as it is otherwise).
using checkpoint_mapping = std::function<std::optional<tensor_source>(std::string const& model_name)>;

}  // namespace shardwise
