// Two FSDP wrap types, one inside the other: the attention's parameters would belong to two units.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using Attention = decltype(Model::block_type::attention);
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_type<Model::block_type, Attention>>;
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_type<Attention>>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
}
