#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct Head {
  sw::Linear<T, sw::layer_at<Plan, "output">> output;
  SHARDWISE_CHILDREN(output)
};
#ifdef SHARDWISE_SHOULD_FAIL
using plan = sw::plan<sw::at<"output", sw::RowwiseParallel<sw::Replicate>>>;
#else
using plan = sw::plan<sw::at<"output", sw::ColwiseParallel<>>>;
#endif
float use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& tp, Head<float, plan>& head, sw::nn::matrix<float> const& x,
          std::vector<std::int64_t> const& targets) {
  return sw::loss_parallel(tp, head.output(x), targets).loss;
}
