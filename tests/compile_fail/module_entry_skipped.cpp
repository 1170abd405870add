#include "one_module.hpp"
namespace sw = shardwise;
using one_module::Model;
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
                      sw::at<"feed_forward.w1", sw::ColwiseParallel<>>>;
auto use(Model<float, plan>& model, sw::Activation<float, sw::Shard<0>> const& x) {
#ifdef SHARDWISE_SHOULD_FAIL
  return model.feed_forward.forward(x);  // skips the entry: w1 gets the sequence-cut input
#else
  return sw::forward(model.feed_forward, x);
#endif
}
