#include <shardwise/nn/activation.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using layout = sw::Partial<sw::Sum>;
#else
using layout = sw::Replicate;
#endif
sw::Activation<float, layout> use(sw::Activation<float, layout> const& a, sw::Activation<float, layout> const& b) {
  return a * b;
}
