// A plan entry that is a bare style, without shardwise::at<"path", Style>.
#include <shardwise/plan/plan.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Plan = sw::plan<sw::at<"w1", sw::NoParallel>, sw::NoParallel>;
#else
using Plan = sw::plan<sw::at<"w1", sw::NoParallel>, sw::at<"w2", sw::NoParallel>>;
#endif
std::size_t entries() { return Plan::paths.size(); }
