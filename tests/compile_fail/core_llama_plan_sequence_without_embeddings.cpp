// A Llama plan with sequence parallelism on but the embeddings left unsharded.
#include <shardwise/models/llama_plan.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Plan = sw::models::llama_plan</*SequenceParallel=*/true, /*ParallelizeEmbeddings=*/false>;
#else
using Plan = sw::models::llama_plan</*SequenceParallel=*/false, /*ParallelizeEmbeddings=*/false>;
#endif
std::size_t entries() { return Plan::paths.size(); }
