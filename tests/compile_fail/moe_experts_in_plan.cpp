// The MoE block's experts take and give replicated rows: a plan that cuts an expert's w1 alone (its w2 whole) is
// refused; w1, w3 ColwiseParallel<> and w2 RowwiseParallel<Shard<-1>, Replicate> with PrepareModuleInput at the
// expert compile.
#include <shardwise/models/moe.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"experts.*.w1", sw::ColwiseParallel<>>>;
#else
using plan = sw::plan<sw::at<"experts.*", sw::PrepareModuleInput<sw::Replicate, sw::Replicate>>,
                      sw::at<"experts.*.w1", sw::ColwiseParallel<>>, sw::at<"experts.*.w3", sw::ColwiseParallel<>>,
                      sw::at<"experts.*.w2", sw::RowwiseParallel<sw::Shard<-1>, sw::Replicate>>>;
#endif
void build(shardwise::models::MoeConfig const& c) {
  shardwise::models::MoeFeedForward<float, plan> moe(c, 1);
  (void)moe;
}
