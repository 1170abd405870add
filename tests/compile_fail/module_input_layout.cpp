#include "one_module.hpp"
namespace sw = shardwise;
using one_module::Model;
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
                      sw::at<"feed_forward.w1", sw::ColwiseParallel<>>>;
#ifdef SHARDWISE_SHOULD_FAIL
using given = sw::Replicate;  // the entry says the module's input comes sequence-sharded
#else
using given = sw::Shard<0>;
#endif
auto use(Model<float, plan>& model, sw::Activation<float, given> const& x) {
  return sw::forward(model.feed_forward, x);
}
