// The adapters of a model under hybrid sharding (fully_shard(model, dp, replicate)) given to save_lora: not offered
// yet, refused with the library's words; one sharded over one dp mesh saves them.
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/peft.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float>;
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_none>;
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"replicate">, sw::axis<"dp">> const& mesh) {
  sw::LoraConfig const lora{.rank = 4, .alpha = 8, .target_modules = {"layers.*.attention.wq"}};
#ifdef SHARDWISE_SHOULD_FAIL
  auto sharded = sw::fully_shard<policy>(model, sw::submesh<"dp">(mesh), sw::submesh<"replicate">(mesh));
  sw::save_lora(sharded, "adapter", lora);
#else
  auto sharded = sw::fully_shard<policy>(model, sw::submesh<"dp">(mesh));
  sw::save_lora(sharded, "adapter", lora);
#endif
}
