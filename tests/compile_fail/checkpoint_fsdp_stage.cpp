// A pipeline stage under FSDP given to the saves of a model under FSDP, which do not take the pipeline axis: every
// stage would write the same rank files into one folder. Refused until FSDP stages have checkpoints of their own.
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
namespace models = shardwise::models;
using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
#ifdef SHARDWISE_SHOULD_FAIL
using Model = sw::stage_chunks<models::LlamaStage<float>>;
#else
using Model = models::Llama<float>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
  auto sharded = sw::fully_shard<policy>(model, dp);
  sw::save_sharded(sharded, "ckpt", 1);
}
