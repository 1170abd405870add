#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct Block {
  sw::RMSNorm<T, sw::layer_at<Plan, "norm">> norm;
  SHARDWISE_CHILDREN(norm)
};
using plan = sw::plan<sw::at<"norm", sw::SequenceParallel<>>>;
void use(Block<float, plan>& block, sw::SGD<float> const& sgd) {
#ifdef SHARDWISE_SHOULD_FAIL
  sgd.step(block.norm.parameters());  // each rank holds the gradient of its own tokens only
#else
  sgd.step(sw::reduce(block.norm.parameters()));
#endif
}
