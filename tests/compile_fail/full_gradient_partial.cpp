#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct Block {
  sw::RMSNorm<T, sw::layer_at<Plan, "norm">> norm;
  SHARDWISE_CHILDREN(norm)
  Block() : norm(8) {}
};
using plan = sw::plan<sw::at<"norm", sw::SequenceParallel<>>>;
void use(Block<float, plan>& block) {
#ifdef SHARDWISE_SHOULD_FAIL
  sw::for_each_parameter(block, [](std::string const&, auto const& p) { (void)sw::full_gradient(p); });
#else
  sw::for_each_parameter(sw::finish_gradients(block),
                         [](std::string const&, auto const& p) { (void)sw::full_gradient(p); });
#endif
}
