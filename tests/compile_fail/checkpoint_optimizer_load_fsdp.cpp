// An FSDP model (sw::fully_shard's) and its AdamW given to the dp x tp load with the optimizer, which slices the
// state for ZeRO-1: a model under FSDP shards its state itself and loads through its own overload,
// load_sharded(sharded, optimizer, [tp,] dir).
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_none>;
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh) {
  auto sharded = sw::fully_shard<policy>(model, sw::submesh<"dp">(mesh));
  sw::AdamW<float> optimizer({.learning_rate = 1e-2f});
#ifdef SHARDWISE_SHOULD_FAIL
  (void)sw::load_sharded(sharded, optimizer, sw::submesh<"tp">(mesh), sw::submesh<"dp">(mesh), "ckpt");
#else
  (void)sw::load_sharded(sharded, optimizer, sw::submesh<"tp">(mesh), "ckpt");
#endif
}
