// A module's shapes must be one per child, in the order of SHARDWISE_CHILDREN.
#include <tuple>

#include "one_module.hpp"
namespace sw = shardwise;
using model = one_module::Model<float, sw::plan<sw::at<"feed_forward.w1", sw::ColwiseParallel<>>>>;
#ifdef SHARDWISE_SHOULD_FAIL
constexpr auto feed_forward = std::tuple{sw::linear_shape{8, 8}, sw::linear_shape{8, 8}};  // it has one child
#else
constexpr auto feed_forward = std::make_tuple(sw::linear_shape{8, 8});
#endif
static_assert(sw::parameter_count<model>(std::make_tuple(feed_forward), sw::cost_inputs{8, 2, 0}) == 2);
