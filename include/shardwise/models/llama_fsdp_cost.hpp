#pragma once
// The transfers of a Llama training step under FSDP (sw::fully_shard, alone on a dp mesh or with tensor
// parallelism), derived: the model's own forward and backward run on shapes with the schedule fully_shard's hooks
// use (sw::fsdp_step_cost), for the wrap policy, strategy, precision and options the step ran with.
#include <cstddef>
#include <string_view>
#include <utility>

#include "shardwise/cost/transfer.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/fsdp/step_cost.hpp"
#include "shardwise/models/llama.hpp"

namespace shardwise::models {

/// How fully_shard's wrap policy cut the Llama model into units.
enum class llama_fsdp_wrap {
  blocks,  ///< wrap_paths<"layers.*"> or wrap_type of its block: a unit per block (torchtitan's).
  none,    ///< wrap_none: the root unit holds every parameter.
  by_size  ///< wrap_min_params with fsdp_cost_options::min_num_params (children first: attention, feed-forward, block).
};

/// What changes the order or the size of an FSDP step's transfers besides the strategy and the precision: the
/// fsdp_options and the model's settings the step ran with.
struct fsdp_cost_options {
  llama_fsdp_wrap wrap = llama_fsdp_wrap::blocks;  ///< The units.
  std::size_t min_num_params = 100'000'000;        ///< fsdp_options::min_num_params, for llama_fsdp_wrap::by_size.
  bool forward_prefetch = false;                   ///< fsdp_options::forward_prefetch.
  bool backward_prefetch = false;                  ///< fsdp_options::backward_prefetch.
  bool checkpointed_blocks = false;                ///< Llama::checkpoint_blocks(true): each block's forward runs again.
  std::size_t replicate = 1;                       ///< Hybrid sharding: the replicate mesh's size (1: none).
  std::string_view replicate_axis = "replicate";   ///< Its axis' name.
};

namespace detail {
template <class T, class Strategy, class Plan, class Precision, class Wrap, std::size_t Capacity>
transfer_list<Capacity> llama_fsdp_transfers(LlamaConfig const& c, training_step_inputs const& t,
                                             fsdp_cost_options const& o, bool parallelized) {
  using Shapes = Llama<meta<T>, Plan>;
  fsdp_step_inputs step{t.tp, t.microbatches, t.dp, t.dp_rank, t.dp_axis, o.replicate, o.replicate_axis, parallelized};
  step.options.min_num_params = o.min_num_params;
  step.options.forward_prefetch = o.forward_prefetch, step.options.backward_prefetch = o.backward_prefetch;
  auto const prepare = [&](Shapes& model) { model.checkpoint_blocks(o.checkpointed_blocks); };
  auto const loss = [&](auto&& logits, meta_ids ids) {
    return llama_loss(*logits.local.trace(), std::move(logits), ids, c.vocabulary).dlogits;
  };
  return fsdp_step_cost<fsdp_policy<Strategy, Wrap, Precision>, Shapes, Capacity>(step, prepare, loss, c);
}
}  // namespace detail

/// The transfers of one training step of Llama<T, Plan> under sw::fully_shard<fsdp_policy<Strategy, Wrap,
/// Precision>> (Wrap as `o.wrap` says) on a (replicate x) dp x tp mesh (the model given to sw::parallelize over
/// tp, or the 2-D mesh given to fully_shard), in the order they run on this rank: `t.microbatches` forward and
/// backward passes, each followed by llama_loss, then AdamW::step(sharded)'s norm. Derived by sw::fsdp_step_cost
/// from the model's code and fully_shard's schedule: each unit gathered before its module's forward (and, full
/// shard, again before its backward; prefetched a unit ahead with the options), its gradients finished over tp
/// and reduced over dp after its backward, the root's last. Gathers move Precision's param_type, reductions its
/// reduce_type. Computed at run time.
template <class T, class Strategy, class Plan, class Precision = full_precision, std::size_t Capacity = 1024>
transfer_list<Capacity> llama_fsdp_step_cost(LlamaConfig const& c, training_step_inputs const& t,
                                             fsdp_cost_options const& o = {}) {
  switch (o.wrap) {
    case llama_fsdp_wrap::none:
      return detail::llama_fsdp_transfers<T, Strategy, Plan, Precision, wrap_none, Capacity>(c, t, o, true);
    case llama_fsdp_wrap::by_size:
      return detail::llama_fsdp_transfers<T, Strategy, Plan, Precision, wrap_min_params, Capacity>(c, t, o, true);
    case llama_fsdp_wrap::blocks:
      break;
  }
  return detail::llama_fsdp_transfers<T, Strategy, Plan, Precision, wrap_paths<"layers.*">, Capacity>(c, t, o, true);
}

/// The transfers on the dp axis (`dp` ranks, this rank `dp_rank`) of one training step of Llama<T> (tp 1, not
/// parallelized) under sw::fully_shard<fsdp_policy<Strategy, wrap_paths<"layers.*">>> with `microbatches` forward
/// and backward passes, then AdamW's step: as above. no_shard gathers nothing and all-reduces each gradient; its
/// norm needs no all-reduce.
template <class T, class Strategy = full_shard, std::size_t Capacity = 1024>
transfer_list<Capacity> llama_fsdp_step_cost(LlamaConfig const& c, std::size_t dp, std::size_t dp_rank,
                                             std::size_t microbatches = 1, std::string_view axis = "dp") {
  training_step_inputs const t{{1, 1, 0, "tp"}, microbatches, dp, dp_rank, false, axis};
  return detail::llama_fsdp_transfers<T, Strategy, serial_plan, full_precision, wrap_paths<"layers.*">, Capacity>(
      c, t, {}, false);
}

}  // namespace shardwise::models
