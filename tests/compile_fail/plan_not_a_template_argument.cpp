#include <shardwise/mesh/serial.hpp>
#include <shardwise/nn.hpp>
namespace sw = shardwise;
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w2", sw::RowwiseParallel<>>>;
#ifdef SHARDWISE_SHOULD_FAIL
// The plan is fixed inside the class: its entries are in no type parallelize can read, so it cannot check them.
struct FeedForward {
  sw::Linear<float, sw::layer_at<plan, "w1">> w1;
  sw::Linear<float, sw::layer_at<plan, "w2">> w2;
  SHARDWISE_CHILDREN(w1, w2)
  FeedForward() : w1(8, 16, 1), w2(16, 8, 2) {}
};
void use(FeedForward& model, sw::Mesh<sw::SerialComm, sw::axis<"tp">> const& tp) { sw::parallelize(model, tp); }
#else
template <class T, class Plan>
struct FeedForward {
  sw::Linear<T, sw::layer_at<Plan, "w1">> w1;
  sw::Linear<T, sw::layer_at<Plan, "w2">> w2;
  SHARDWISE_CHILDREN(w1, w2)
  FeedForward() : w1(8, 16, 1), w2(16, 8, 2) {}
};
void use(FeedForward<float, plan>& model, sw::Mesh<sw::SerialComm, sw::axis<"tp">> const& tp) {
  sw::parallelize(model, tp);
}
#endif
