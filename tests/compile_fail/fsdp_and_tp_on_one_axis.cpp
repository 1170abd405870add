// FSDP sharding over the axis the tensor-parallel plan already cuts layers over.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float, sw::models::llama_plan<true>>;
#ifdef SHARDWISE_SHOULD_FAIL
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">, sw::full_precision, "tp", "tp">;
#else
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">, sw::full_precision, "dp", "tp">;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh) {
  auto sharded = sw::fully_shard<policy>(model, mesh);
}
