#include <shardwise/nn/activation.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using layout = int;
#else
using layout = sw::Shard<0>;
#endif
template struct sw::Activation<float, layout>;
