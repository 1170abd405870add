// Hybrid sharding given 2-D meshes: the shard and the replicate mesh must each be one axis.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
using OneAxis = sw::Mesh<sw::ThreadComm, sw::axis<"dp">>;
using TwoAxes = sw::Mesh<sw::ThreadComm, sw::axis<"replicate">, sw::axis<"dp">>;
#ifdef SHARDWISE_SHOULD_FAIL
void use(Model& model, TwoAxes const& mesh, TwoAxes const& replicate) {
  auto sharded = sw::fully_shard<policy>(model, mesh, replicate);
}
#else
void use(Model& model, OneAxis const& dp, OneAxis const& replicate) {
  auto sharded = sw::fully_shard<policy>(model, dp, replicate);
}
#endif
