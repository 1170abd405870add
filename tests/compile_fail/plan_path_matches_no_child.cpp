#include <shardwise/nn.hpp>

#include "../../examples/blocks.hpp"
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w4", sw::RowwiseParallel<>>>;  // no child w4
#else
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w2", sw::RowwiseParallel<>>>;
#endif
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& tp) {
  blocks::FeedForward<float, plan> ffn(8, 16, 1);
  sw::parallelize(ffn, tp);
}
