#include <shardwise/nn/layers/norm.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"norm", sw::SequenceParallel<>>>;
#else
using plan = sw::plan<sw::at<"norm", sw::NoParallel>>;
#endif
// A replicated activation given to a norm: fine unsharded; under SequenceParallel the norm expects Shard<0>.
auto use(sw::LayerNorm<float, sw::layer_at<plan, "norm">>& norm, sw::Activation<float, sw::Replicate> const& x) {
  return norm(x);
}
