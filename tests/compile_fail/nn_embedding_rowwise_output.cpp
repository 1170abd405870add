#include <shardwise/nn/layers/embedding.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"tok", sw::RowwiseParallel<sw::Replicate, sw::Shard<-1>>>>;
#else
using plan = sw::plan<sw::at<"tok", sw::RowwiseParallel<sw::Replicate, sw::Shard<0>>>>;
#endif
template class sw::Embedding<float, sw::layer_at<plan, "tok">>;
