#include "one_module.hpp"
namespace sw = shardwise;
using one_module::Model;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"feed_forward", sw::ColwiseParallel<>>>;  // a layer's style on a module's path
#else
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleInput<sw::Replicate, sw::Replicate>>>;
#endif
auto use(Model<float, plan>& model, sw::nn::matrix<float> const& x) { return sw::forward(model.feed_forward, x); }
