// A vector child is walked from a sw::repeated_shape: how many, and each one's shape.
#include <tuple>
#include <vector>

#include "one_module.hpp"
namespace sw = shardwise;
using block = one_module::FeedForward<float, sw::serial_plan>;
struct Stack {
  std::vector<block> layers;
  SHARDWISE_CHILDREN(layers)
};
#ifdef SHARDWISE_SHOULD_FAIL
constexpr auto layers = std::tuple{sw::linear_shape{8, 8}};  // the element's shape, without the count
#else
constexpr auto layers = sw::repeated_shape{3, std::tuple{sw::linear_shape{8, 8}}};
#endif
static_assert(sw::parameter_count<Stack>(std::tuple{layers}) == 6);
