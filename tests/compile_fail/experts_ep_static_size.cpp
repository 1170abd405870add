// An ep mesh of static size that does not divide a MoeLlama's static expert count is a compile error naming the
// block's path and both numbers.
#include <shardwise/models/llama.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Model = sw::models::MoeLlama<float, sw::serial_plan, 6>;
#else
using Model = sw::models::MoeLlama<float, sw::serial_plan, 8>;
#endif
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"ep", 4>> const& ep) {
  (void)sw::expert_parallelize(model, ep);
}
