// In an FSDP step cost the model runs on shapes (element type sw::meta<T>): a wrap_type naming the real model's
// block would match no module, leave every parameter in the root unit and predict another step.
#include <shardwise/fsdp/step_cost.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <utility>
namespace sw = shardwise;
namespace models = shardwise::models;
using shapes = models::Llama<sw::meta<float>>;
#ifdef SHARDWISE_SHOULD_FAIL
using block = models::Llama<float>::block_type;
#else
using block = shapes::block_type;
#endif
std::size_t gathers(models::LlamaConfig const& c) {
  sw::fsdp_step_inputs t;
  t.tp.tokens = c.sequence;
  t.dp = 2;
  auto const loss = [&](auto&& logits, sw::meta_ids ids) {
    return models::llama_loss(*logits.local.trace(), std::move(logits), ids, c.vocabulary).dlogits;
  };
  using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_type<block>>;
  return sw::fsdp_step_cost<policy, shapes>(t, [](shapes&) {}, loss, c).size();
}
