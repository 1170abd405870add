#include <shardwise/nn/layers/styles.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
template struct sw::SequenceParallel<1>;
#else
template struct sw::SequenceParallel<0>;
#endif
