#pragma once
// The Llama plan, as torchtitan shards Llama in PyTorch, with optimum-neuron's Parallelizer options as
// template parameters: parallelize_embeddings and sequence_parallel. Under sequence parallelism the residual
// stream is cut along the tokens (Shard<0>) between blocks; each attention and feed-forward gathers it
// (PrepareModuleInput), and its output projection reduce-scatters back. The output projection is
// ColwiseParallel into loss parallel, so the logits are never gathered.
#include <string_view>
#include <type_traits>

#include "shardwise/models/llama.hpp"

namespace shardwise::models {

/// optimum-neuron's predicate for modules to leave alone, at compile time: a type with
/// `static constexpr bool matches(std::string_view path)`. Matching entries get NoParallel; if what is left
/// does not chain (a sharded activation reaching an unsharded layer), that is a compile error.
struct leave_none {
  /// No path matches: every module is sharded as the plan says.
  static constexpr bool matches(std::string_view) { return false; }
};

namespace detail {
/// Plan with the entries under "layers.*.feed_forward." left out (and the gather before it without sequence
/// parallelism, a no-op, kept).
template <class Plan, class Kept = plan<>>
struct without_dense_feed_forward;
template <class... Kept>
struct without_dense_feed_forward<plan<>, plan<Kept...>> {
  using type = plan<Kept...>;
};
template <class First, class... Rest, class... Kept>
struct without_dense_feed_forward<plan<First, Rest...>, plan<Kept...>> {
  static constexpr bool dense = First::path.view().starts_with("layers.*.feed_forward.");
  using type =
      typename without_dense_feed_forward<plan<Rest...>,
                                          std::conditional_t<dense, plan<Kept...>, plan<Kept..., First>>>::type;
};

template <class Plan, class LeaveAlone>
struct leave_alone;
template <class... Entries, class LeaveAlone>
struct leave_alone<plan<Entries...>, LeaveAlone> {
  using type =
      plan<std::conditional_t<LeaveAlone::matches(Entries::path.view()), at<Entries::path, NoParallel>, Entries>...>;
};
}  // namespace detail

/// Builds the Llama plan; use it through llama_plan. SequenceParallel: cut the residual stream along the tokens
/// between blocks (needs ParallelizeEmbeddings). ParallelizeEmbeddings: cut tok_embeddings by the vocabulary.
template <bool SequenceParallel = true, bool ParallelizeEmbeddings = true, class LeaveAlone = leave_none>
struct llama_plan_options {
  static_assert(ParallelizeEmbeddings || !SequenceParallel,
                "shardwise::models::llama_plan: sequence parallelism starts at the embedding's reduce-scatter; "
                "with parallelize_embeddings off, turn sequence_parallel off too");
  using stream = std::conditional_t<SequenceParallel, Shard<0>, Replicate>;  ///< The residual stream's layout.
  /// The RMSNorms' style: SequenceParallel, or none.
  using norm_style = std::conditional_t<SequenceParallel, shardwise::SequenceParallel<>, NoParallel>;
  /// tok_embeddings' style: RowwiseParallel (vocabulary-parallel) into the stream's layout, or none.
  using embedding_style = std::conditional_t<ParallelizeEmbeddings, RowwiseParallel<Replicate, stream>, NoParallel>;
  /// The plan, before LeaveAlone is applied.
  using type = plan<at<"tok_embeddings", embedding_style>,                               //
                    at<"norm", norm_style>,                                              //
                    at<"output", ColwiseParallel<stream, Shard<-1>>>,                    //
                    at<"layers.*.attention_norm", norm_style>,                           //
                    at<"layers.*.attention", PrepareModuleInput<stream, Replicate>>,     //
                    at<"layers.*.attention.wq", ColwiseParallel<>>,                      //
                    at<"layers.*.attention.wk", ColwiseParallel<>>,                      //
                    at<"layers.*.attention.wv", ColwiseParallel<>>,                      //
                    at<"layers.*.attention.wo", RowwiseParallel<Shard<-1>, stream>>,     //
                    at<"layers.*.ffn_norm", norm_style>,                                 //
                    at<"layers.*.feed_forward", PrepareModuleInput<stream, Replicate>>,  //
                    at<"layers.*.feed_forward.w1", ColwiseParallel<>>,                   //
                    at<"layers.*.feed_forward.w3", ColwiseParallel<>>,                   //
                    at<"layers.*.feed_forward.w2", RowwiseParallel<Shard<-1>, stream>>>;
};

template <bool SequenceParallel = true, bool ParallelizeEmbeddings = true, class LeaveAlone = leave_none>
using llama_plan =
    typename detail::leave_alone<typename llama_plan_options<SequenceParallel, ParallelizeEmbeddings>::type,
                                 LeaveAlone>::type;

}  // namespace shardwise::models

namespace shardwise::models {

namespace detail {
template <class Plan, class... More>
struct with_entries;
template <class... Entries, class... More>
struct with_entries<plan<Entries...>, More...> {
  using type = plan<Entries..., More...>;
};
/// The entries that cut every expert's SwiGLU (and the shared expert's) over tp as a dense feed-forward's, each
/// expert's input gradient summed over tp by its PrepareModuleInput entry.
template <class Plan>
using with_experts_cut =
    typename with_entries<Plan, at<"layers.*.feed_forward.experts.*", PrepareModuleInput<Replicate, Replicate>>,
                          at<"layers.*.feed_forward.experts.*.w1", ColwiseParallel<>>,
                          at<"layers.*.feed_forward.experts.*.w3", ColwiseParallel<>>,
                          at<"layers.*.feed_forward.experts.*.w2", RowwiseParallel<Shard<-1>, Replicate>>,
                          at<"layers.*.feed_forward.shared_expert", PrepareModuleInput<Replicate, Replicate>>,
                          at<"layers.*.feed_forward.shared_expert.w1", ColwiseParallel<>>,
                          at<"layers.*.feed_forward.shared_expert.w3", ColwiseParallel<>>,
                          at<"layers.*.feed_forward.shared_expert.w2", RowwiseParallel<Shard<-1>, Replicate>>>::type;

/// Plan with the entry at "layers.*.feed_forward" given Style (the block of experts' own entry).
template <class Plan, class Style>
struct with_feed_forward_entry;
template <class... Entries, class Style>
struct with_feed_forward_entry<plan<Entries...>, Style> {
  using type =
      plan<std::conditional_t<Entries::path.view() == "layers.*.feed_forward", at<Entries::path, Style>, Entries>...>;
};
/// The MoeLlama plan before its experts are cut: under sequence parallelism, the block of experts gathers the
/// stream's tokens and keeps its own rows of the output (it computes every token, as its router must).
template <bool SequenceParallel, bool ParallelizeEmbeddings>
using moe_base_plan = typename with_feed_forward_entry<
    typename without_dense_feed_forward<
        typename llama_plan_options<SequenceParallel, ParallelizeEmbeddings>::type>::type,
    std::conditional_t<SequenceParallel, PrepareModuleInputOutput<Shard<0>, Replicate, Replicate, Shard<0>>,
                       PrepareModuleInput<Replicate, Replicate>>>::type;
}  // namespace detail

/// The plan of a models::MoeLlama: llama_plan's with the attention's projections cut over tp (and the embedding and
/// output by the vocabulary, with ParallelizeEmbeddings); the experts whole on every rank, or with CutExperts each
/// expert's SwiGLU cut over tp as a dense feed-forward's (expert tensor parallelism: Megatron-Core's
/// expert_tensor_parallel_size equal to tp), the shared expert's too. With SequenceParallel the stream between
/// blocks is cut along the tokens, and each block of experts gathers them and hands back its rank's rows.
template <bool ParallelizeEmbeddings = true, bool CutExperts = false, bool SequenceParallel = false>
using moe_llama_plan =
    std::conditional_t<CutExperts,
                       detail::with_experts_cut<detail::moe_base_plan<SequenceParallel, ParallelizeEmbeddings>>,
                       detail::moe_base_plan<SequenceParallel, ParallelizeEmbeddings>>;

}  // namespace shardwise::models
