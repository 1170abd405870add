#pragma once
// The GPT-2 plan, Megatron's cut in the style of llama_plan: wte vocabulary-parallel (RowwiseParallel), q, k, v
// and c_fc ColwiseParallel, the attention's and the MLP's c_proj RowwiseParallel, and lm_head (tied to wte, so
// cut by the vocabulary too) ColwiseParallel into loss parallel, so the logits are never gathered. Under
// sequence parallelism the residual stream is cut along the tokens (Shard<0>) between blocks, the LayerNorms
// are SequenceParallel, and wpe is RowwiseParallel into Shard<0> as wte is, so that the positions arrive in
// the stream's layout (one more reduce-scatter of [tokens, dim]); without it wpe stays whole on every rank.
#include <span>
#include <type_traits>

#include "shardwise/models/gpt2.hpp"

namespace shardwise::models {

/// Builds the GPT-2 plan; use it through gpt2_plan. SequenceParallel: cut the residual stream along the tokens
/// between blocks.
template <bool SequenceParallel = true>
struct gpt2_plan_options {
  using stream = std::conditional_t<SequenceParallel, Shard<0>, Replicate>;  ///< The residual stream's layout.
  /// The LayerNorms' style: SequenceParallel, or none.
  using norm_style = std::conditional_t<SequenceParallel, shardwise::SequenceParallel<>, NoParallel>;
  /// wpe's style: RowwiseParallel into the stream's Shard<0>, or none (whole on every rank).
  using position_style = std::conditional_t<SequenceParallel, RowwiseParallel<Replicate, Shard<0>>, NoParallel>;
  /// The plan.
  using type = plan<at<"wte", RowwiseParallel<Replicate, stream>>,              //
                    at<"wpe", position_style>,                                  //
                    at<"ln_f", norm_style>,                                     //
                    at<"lm_head", ColwiseParallel<stream, Shard<-1>>>,          //
                    at<"h.*.ln_1", norm_style>,                                 //
                    at<"h.*.attn", PrepareModuleInput<stream, Replicate>>,      //
                    at<"h.*.attn.q_proj", ColwiseParallel<>>,                   //
                    at<"h.*.attn.k_proj", ColwiseParallel<>>,                   //
                    at<"h.*.attn.v_proj", ColwiseParallel<>>,                   //
                    at<"h.*.attn.c_proj", RowwiseParallel<Shard<-1>, stream>>,  //
                    at<"h.*.ln_2", norm_style>,                                 //
                    at<"h.*.mlp", PrepareModuleInput<stream, Replicate>>,       //
                    at<"h.*.mlp.c_fc", ColwiseParallel<>>,                      //
                    at<"h.*.mlp.c_proj", RowwiseParallel<Shard<-1>, stream>>>;
};

template <bool SequenceParallel = true>
using gpt2_plan = typename gpt2_plan_options<SequenceParallel>::type;

/// Cross-entropy matching the logits' layout: loss parallel on vocabulary-sharded logits, plain otherwise.
/// `vocabulary`: the real vocabulary size, so the columns of vocabulary padding are left out.
template <class Mesh, class T, class P>
LossAndGradient<T, P> gpt2_loss(Mesh const& tp, Activation<T, P> const& logits, std::span<const std::int64_t> targets,
                                std::size_t vocabulary) {
  return cross_entropy(tp, logits, targets, -100, static_cast<std::int64_t>(vocabulary));
}

}  // namespace shardwise::models
