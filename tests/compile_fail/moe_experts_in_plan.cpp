// The MoE block's experts computes whole on every rank: a plan that cuts it is refused, naming its path.
#include <shardwise/models/moe.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"experts.*.w1", sw::ColwiseParallel<>>>;
#else
using plan = sw::serial_plan;
#endif
void build(shardwise::models::MoeConfig const& c) {
  shardwise::models::MoeFeedForward<float, plan> moe(c, 1);
  (void)moe;
}
