#include <shardwise/models/llama_plan.hpp>
namespace sw = shardwise;
using Model = sw::models::Llama<float, sw::models::llama_plan<true>>;  // sequence parallel: norms' gradients Partial
void use(Model& model, sw::AdamW<float>& optimizer, sw::Mesh<sw::ThreadComm, sw::axis<"dp">> const& dp) {
#ifdef SHARDWISE_SHOULD_FAIL
  optimizer.step(model, dp);
#else
  optimizer.step(sw::finish_gradients(model), dp);
#endif
}
