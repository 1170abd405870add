#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct Head {
#ifdef SHARDWISE_SHOULD_FAIL
  sw::Linear<T, sw::layer_at<Plan, "output">, 64, 1002> output;  // a vocabulary of 1002 over 4 ranks
#else
  sw::Linear<T, sw::layer_at<Plan, "output">, 64, 1000> output;
#endif
  SHARDWISE_CHILDREN(output)
};
using plan = sw::plan<sw::at<"output", sw::ColwiseParallel<>>>;
template <class Model>
void use(Model& model, sw::Mesh<sw::ThreadComm, sw::axis<"tp", 4>> const& tp) {
  sw::parallelize(model, tp);
}
template void use(Head<float, plan>&, sw::Mesh<sw::ThreadComm, sw::axis<"tp", 4>> const&);
