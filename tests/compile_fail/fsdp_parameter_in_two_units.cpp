// Two FSDP wrap paths, one under the other: the attention's parameters would belong to two units.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*", "layers.*.attention">>;
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*.feed_forward", "layers.*.attention">>;
#endif
void use(sw::models::Llama<float>& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
}
