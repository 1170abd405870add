#include <shardwise/nn.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w1", sw::RowwiseParallel<>>>;
#else
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w2", sw::RowwiseParallel<>>>;
#endif
plan p;
