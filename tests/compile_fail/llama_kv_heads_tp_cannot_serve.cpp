// Static head counts on the Llama type against a static tp size: 12 heads and 3 key-value heads cannot be
// served by 4 ranks (3 heads per rank, but rank 1's need two key-value heads: tp neither divides 3 nor is a multiple of
// it); 8 and 2 can (multiplier 2).
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
namespace models = shardwise::models;
#ifdef SHARDWISE_SHOULD_FAIL
using Model = models::Llama<float, models::llama_plan<true>, 12, 3>;
#else
using Model = models::Llama<float, models::llama_plan<true>, 8, 2>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"tp", 4>> const& tp) { sw::parallelize(model, tp); }
