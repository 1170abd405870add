// An FSDP policy whose strategy is not one of full_shard, shard_grad_op, no_shard.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::wrap_none>;  // the wrap policy given where the strategy goes
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_none>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
}
