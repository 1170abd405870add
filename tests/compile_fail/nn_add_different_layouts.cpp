#include <shardwise/nn/activation.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using other = sw::Shard<1>;
#else
using other = sw::Shard<-2>;  // the same layout as Shard<0> on [tokens, features]
#endif
sw::Activation<float, sw::Shard<0>> use(sw::Activation<float, sw::Shard<0>> const& a,
                                        sw::Activation<float, other> const& b) {
  return a + b;
}
