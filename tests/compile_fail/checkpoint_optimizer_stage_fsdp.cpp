// An FSDP model (sw::fully_shard's) and its AdamW given to the pipeline stage's save with the optimizer, which
// gathers ZeRO-1's slices of the state: a model under FSDP shards its state itself and saves through its own
// overload, save_sharded(sharded, optimizer, [tp,] dir, step).
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_none>;
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"pp">, sw::axis<"tp">> const& mesh) {
  auto sharded = sw::fully_shard<policy>(model, sw::submesh<"dp">(mesh));
  sw::AdamW<float> optimizer({.learning_rate = 1e-2f});
#ifdef SHARDWISE_SHOULD_FAIL
  sw::save_sharded(sharded, optimizer, sw::submesh<"tp">(mesh), sw::submesh<"pp">(mesh), sw::submesh<"dp">(mesh),
                   "ckpt", 1);
#else
  sw::save_sharded(sharded, optimizer, sw::submesh<"tp">(mesh), "ckpt", 1);
#endif
}
