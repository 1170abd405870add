#include <shardwise/nn/layers/embedding.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"tok", sw::ColwiseParallel<sw::Replicate, sw::Shard<0>>>>;
#else
using plan = sw::plan<sw::at<"tok", sw::ColwiseParallel<sw::Replicate, sw::Replicate>>>;
#endif
template class sw::Embedding<float, sw::layer_at<plan, "tok">>;
