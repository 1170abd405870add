// An FSDP policy whose wrap policy is not one of wrap_paths, wrap_type, wrap_min_params, wrap_none.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::full_shard, sw::full_precision>;  // the precision given where the wrap goes
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_none, sw::full_precision>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
}
