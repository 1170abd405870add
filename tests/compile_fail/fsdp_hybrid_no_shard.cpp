// Hybrid sharding (a shard and a replicate mesh) with no_shard, which has nothing to shard.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::no_shard, sw::wrap_paths<"layers.*">>;
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp,
         sw::Mesh<sw::ThreadComm, sw::axis<"replicate">> const& replicate) {
  auto sharded = sw::fully_shard<policy>(model, dp, replicate);
}
