#include <shardwise/nn.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"q_norm", sw::SequenceParallel<>>>;
#else
using plan = sw::plan<sw::at<"wq", sw::ColwiseParallel<>>>;
#endif
template class sw::HeadRMSNorm<float, sw::layer_at<plan, "q_norm">, sw::Shard<1>>;
