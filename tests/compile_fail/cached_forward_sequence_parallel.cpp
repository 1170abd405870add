// A forward with a key-value cache on a Llama whose plan cuts the residual stream by tokens (sequence
// parallelism) is refused at compile time, naming the plan to use instead.
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/inference.hpp>
#include <shardwise/models/llama_plan.hpp>
namespace sw = shardwise;
namespace models = shardwise::models;
#ifdef SHARDWISE_SHOULD_FAIL
using Model = models::Llama<float, models::llama_plan<true>>;
#else
using Model = models::Llama<float, models::llama_plan<false>>;
#endif
void use(Model& model, std::span<const std::int64_t> ids, sw::cache_step const& step, sw::kv_cache<float>& cache) {
  (void)model.forward(ids, step, cache);
}
