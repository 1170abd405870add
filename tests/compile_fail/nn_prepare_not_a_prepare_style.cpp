#include <shardwise/nn/prepare.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"ffn", sw::ColwiseParallel<>>>;
#else
using plan = sw::plan<sw::at<"ffn", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>>;
#endif
template class sw::Prepare<float, sw::style_at<plan, "ffn">>;
