// fully_shard on a mesh with a third axis ("pp") that FSDP would leave out.
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
#ifdef SHARDWISE_SHOULD_FAIL
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"pp">, sw::axis<"dp">, sw::axis<"tp">> const& mesh) {
  auto sharded = sw::fully_shard<policy>(model, mesh);
}
#else
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh) {
  auto sharded = sw::fully_shard<policy>(model, mesh);
}
#endif
