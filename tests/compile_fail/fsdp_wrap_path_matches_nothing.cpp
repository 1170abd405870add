// An FSDP wrap path that names no module of the model ("layer.*" for "layers.*") would silently wrap nothing.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*", "layer.*">>;
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
#endif
void use(sw::models::Llama<float>& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
}
