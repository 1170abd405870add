#include <shardwise/nn/activation.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using other = sw::Replicate;
#else
using other = sw::Shard<-1>;  // the same layout as Shard<1> on [tokens, features]
#endif
sw::Activation<float, sw::Shard<1>> use(sw::Activation<float, sw::Shard<1>> const& a,
                                        sw::Activation<float, other> const& b) {
  return a * b;
}
