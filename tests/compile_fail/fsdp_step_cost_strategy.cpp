// An FSDP step cost for a policy whose strategy is none of FSDP's would record a step no fully_shard runs.
#include <shardwise/models/llama_fsdp_cost.hpp>
namespace sw = shardwise;
namespace models = shardwise::models;
#ifdef SHARDWISE_SHOULD_FAIL
using strategy = int;
#else
using strategy = sw::full_shard;
#endif
std::size_t gathers(models::LlamaConfig const& c) {
  return models::llama_fsdp_step_cost<float, strategy>(c, 2, 0).size();
}
