// A layer walks its parameters from its own kind of shape: a Linear from a sw::linear_shape.
#include <tuple>

#include "one_module.hpp"
namespace sw = shardwise;
using model = one_module::Model<float, sw::plan<sw::at<"feed_forward.w1", sw::ColwiseParallel<>>>>;
#ifdef SHARDWISE_SHOULD_FAIL
constexpr auto w1 = sw::norm_shape{8};  // w1 is a Linear
#else
constexpr auto w1 = sw::linear_shape{8, 8};
#endif
static_assert(sw::parameter_count<model>(std::make_tuple(std::make_tuple(w1)), sw::cost_inputs{8, 2, 0}) == 2);
