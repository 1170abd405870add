// An FSDP model (sw::fully_shard's) given to the asynchronous save, which saves tensor-parallel shards only:
// FSDP models save synchronously.
#include <shardwise/checkpoint/async_save.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_none>;
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh, sw::async_save& saver) {
  auto sharded = sw::fully_shard<policy>(model, sw::submesh<"dp">(mesh));
#ifdef SHARDWISE_SHOULD_FAIL
  sw::save_sharded(sharded, sw::submesh<"tp">(mesh), "ckpt", 1, saver);
#else
  sw::save_sharded(sharded, sw::submesh<"tp">(mesh), "ckpt", 1);
  saver.wait();
#endif
}
