#include "one_module.hpp"
namespace sw = shardwise;
using one_module::Model;
#ifdef SHARDWISE_SHOULD_FAIL
using desired = sw::Partial<sw::Sum>;  // a reduction is RowwiseParallel's output, not something a boundary makes
#else
using desired = sw::Replicate;
#endif
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, desired>>>;
auto use(Model<float, plan>& model, sw::Activation<float, sw::Shard<0>> const& x) {
  return sw::forward(model.feed_forward, x);
}
