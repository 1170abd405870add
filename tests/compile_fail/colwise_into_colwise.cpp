#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct TwoLinears {
  sw::Linear<T, sw::layer_at<Plan, "w1">> w1;
  sw::Linear<T, sw::layer_at<Plan, "w2">> w2;
  SHARDWISE_CHILDREN(w1, w2)
  auto forward(sw::nn::matrix<T> const& x) { return w2(w1(x)); }
};
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w2", sw::ColwiseParallel<>>>;
#else
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w2", sw::RowwiseParallel<>>>;
#endif
auto use(TwoLinears<float, plan>& m, sw::nn::matrix<float> const& x) { return m.forward(x); }
