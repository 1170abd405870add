#include <shardwise/nn/layers/embedding.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"tok", sw::SequenceParallel<>>>;
#else
using plan = sw::plan<sw::at<"tok", sw::RowwiseParallel<>>>;
#endif
template class sw::Embedding<float, sw::layer_at<plan, "tok">>;
