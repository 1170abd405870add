#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct Block {
  sw::LayerNorm<T, sw::layer_at<Plan, "norm">> norm;
  SHARDWISE_CHILDREN(norm)
};
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"norm", sw::ColwiseParallel<>>>;
#else
using plan = sw::plan<sw::at<"norm", sw::SequenceParallel<>>>;
#endif
Block<float, plan>* use(Block<float, plan>* b) { return b; }
template class sw::LayerNorm<float, sw::layer_at<plan, "norm">>;
