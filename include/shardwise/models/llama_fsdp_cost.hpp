#pragma once
// The data-parallel transfers of a Llama training step under FSDP (sw::fully_shard with each block a unit, as
// torchtitan wraps: fsdp_policy<Strategy, wrap_paths<"layers.*">>), without tensor parallelism: every
// parameter's gather and gradient reduction in the order fully_shard runs them, from the config's shapes and
// torch.chunk's rows per dp rank.
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/cost/transfer.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/models/llama.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise::models {

namespace detail {

/// A parameter's shape as FSDP cuts it: rows over dp, each row `cols` elements.
struct fsdp_shape {
  std::size_t rows = 0;  ///< Dimension 0: cut over the dp ranks.
  std::size_t cols = 1;  ///< Elements per row.
};

/// One block's parameters in walk order: attention_norm, wq, wk, wv, wo, ffn_norm, w1, w3, w2.
constexpr std::array<fsdp_shape, 9> block_shapes(LlamaConfig const& c) {
  std::size_t const q = c.heads * c.head_dim(), kv = c.kv_heads * c.head_dim();
  return {{{c.dim, 1},
           {q, c.dim},
           {kv, c.dim},
           {kv, c.dim},
           {c.dim, q},
           {c.dim, 1},
           {c.hidden, c.dim},
           {c.hidden, c.dim},
           {c.dim, c.hidden}}};
}

/// Appends one transfer per parameter of `shapes` (the first `count`): an all-gather of this rank's rows, a
/// reduce-scatter of the whole gradient, or an all-reduce of it.
template <std::size_t Capacity, std::size_t N>
constexpr void add_per_parameter(transfer_list<Capacity>& list, transfer_kind kind,
                                 std::array<fsdp_shape, N> const& shapes, std::size_t count, std::size_t dp,
                                 std::size_t dp_rank, std::size_t element, std::string_view axis) {
  for (std::size_t i = 0; i < count; ++i) {
    std::size_t const rows =
        kind == transfer_kind::all_gather ? chunk_size(shapes[i].rows, dp, dp_rank) : shapes[i].rows;
    list.add(kind, axis, rows * shapes[i].cols * element);
  }
}

}  // namespace detail

/// The transfers on the dp axis (`dp` ranks, this rank `dp_rank`) of one training step of Llama<T> (tp 1) under
/// sw::fully_shard<fsdp_policy<Strategy, wrap_paths<"layers.*">>> with `microbatches` forward and backward
/// passes, then AdamW's step. Per microbatch: the root unit (tok_embeddings, norm, output) gathered, each block
/// gathered in order for the forward; in the backward each block in reverse — gathered again under full shard —
/// and its gradients reduce-scattered, then the root's. Then the clipping norm's all-reduce over dp. no_shard
/// gathers nothing and all-reduces each gradient; its norm needs no all-reduce. The list holds `Capacity` runs:
/// about 6 + 18 x layers per microbatch under full shard (a run merges equal consecutive calls); the default
/// fits 56 layers at one microbatch, and too small a capacity throws naming it.
template <class T, class Strategy = full_shard, std::size_t Capacity = 1024>
constexpr transfer_list<Capacity> llama_fsdp_step_cost(LlamaConfig const& c, std::size_t dp, std::size_t dp_rank,
                                                       std::size_t microbatches = 1, std::string_view axis = "dp") {
  constexpr bool sharded = !std::is_same_v<Strategy, no_shard>;
  constexpr transfer_kind reduce = sharded ? transfer_kind::reduce_scatter : transfer_kind::all_reduce;
  auto const block = detail::block_shapes(c);
  std::array<detail::fsdp_shape, 3> const root{{{c.vocabulary, c.dim}, {c.dim, 1}, {c.vocabulary, c.dim}}};
  std::size_t const root_count = c.tie_word_embeddings ? 2 : 3;
  constexpr std::size_t e = sizeof(T);
  transfer_list<Capacity> list;
  for (std::size_t m = 0; m < microbatches; ++m) {
    if constexpr (sharded) {
      detail::add_per_parameter(list, transfer_kind::all_gather, root, root_count, dp, dp_rank, e, axis);
      for (std::size_t l = 0; l < c.layers; ++l)
        detail::add_per_parameter(list, transfer_kind::all_gather, block, 9, dp, dp_rank, e, axis);
    }
    for (std::size_t l = 0; l < c.layers; ++l) {
      if constexpr (std::is_same_v<Strategy, full_shard>)
        detail::add_per_parameter(list, transfer_kind::all_gather, block, 9, dp, dp_rank, e, axis);
      detail::add_per_parameter(list, reduce, block, 9, dp, dp_rank, e, axis);
    }
    detail::add_per_parameter(list, reduce, root, root_count, dp, dp_rank, e, axis);
  }
  if constexpr (sharded) list.add(transfer_kind::all_reduce, axis, sizeof(T));  // the squared norm, summed
  return list;
}

}  // namespace shardwise::models
