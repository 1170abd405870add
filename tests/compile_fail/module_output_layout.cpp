#include "one_module.hpp"
namespace sw = shardwise;
using one_module::Model;
#ifdef SHARDWISE_SHOULD_FAIL
using said = sw::Shard<0>;  // the module's ColwiseParallel output comes cut by features, not by the sequence
#else
using said = sw::Shard<-1>;
#endif
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleOutput<said, sw::Replicate>>,
                      sw::at<"feed_forward.w1", sw::ColwiseParallel<>>>;
auto use(Model<float, plan>& model, sw::nn::matrix<float> const& x) { return sw::forward(model.feed_forward, x); }
