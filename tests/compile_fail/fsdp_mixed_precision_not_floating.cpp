// Mixed precision with a type that is not floating: gathering parameters as integers would truncate them.
#include <cstdint>
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using precision = sw::mixed_precision<std::int16_t, float>;
#else
using precision = sw::mixed_precision<Eigen::bfloat16, float>;
#endif
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">, precision>;
void use(sw::models::Llama<float>& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
}
