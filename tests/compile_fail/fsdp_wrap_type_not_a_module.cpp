// wrap_type naming a layer (the attention's query projection) instead of a module that holds layers.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using Attention = decltype(Model::block_type::attention);
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_type<decltype(Attention::wq)>>;
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_type<Attention>>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
}
