#include <shardwise/nn/layers/linear.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<sw::Replicate, sw::Shard<0>>>>;
#else
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<sw::Replicate, sw::Replicate>>>;
#endif
template class sw::Linear<float, sw::layer_at<plan, "w1">>;
