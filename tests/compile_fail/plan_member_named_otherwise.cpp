#include <shardwise/mesh/serial.hpp>
#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct FeedForward {
  sw::Linear<T, sw::layer_at<Plan, "w1">> w1;
#ifdef SHARDWISE_SHOULD_FAIL
  sw::Linear<T, sw::layer_at<Plan, "w1">> w3;  // copied from w1: takes w1's style and would be saved as w3
#else
  sw::Linear<T, sw::layer_at<Plan, "w3">> w3;
#endif
  SHARDWISE_CHILDREN(w1, w3)
  FeedForward() : w1(8, 16, 1), w3(8, 16, 2) {}
};
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>>;
void use(FeedForward<float, plan>& model, sw::Mesh<sw::SerialComm, sw::axis<"tp">> const& tp) {
  sw::parallelize(model, tp);
}
