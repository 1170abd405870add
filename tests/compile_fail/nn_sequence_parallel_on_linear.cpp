#include <shardwise/nn/layers/linear.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"w1", sw::SequenceParallel<>>>;
#else
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>>;
#endif
template class sw::Linear<float, sw::layer_at<plan, "w1">>;
