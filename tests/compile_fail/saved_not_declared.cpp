// A module whose forward keeps activations but does not name them cannot have several microbatches in flight.
#include <shardwise/nn.hpp>
namespace sw = shardwise;
struct Scale {
  sw::Linear<float> proj{4, 4, 1};
  SHARDWISE_CHILDREN(proj)
#ifndef SHARDWISE_SHOULD_FAIL
  SHARDWISE_SAVED(kept_)
#endif
  sw::nn::matrix<float> kept_;
};
sw::saved_activations<Scale> in_flight;
