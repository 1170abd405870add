#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct FeedForward {
  sw::Linear<T, sw::style_at<Plan, "w1">> w1;
  SHARDWISE_CHILDREN(w1)
  FeedForward() : w1(8, 8, 1) {}
  template <class X>
  auto forward(X const& x) {
    return w1(x);
  }
};
template <class T, class Plan>
struct Model {
  FeedForward<T, sw::subplan<Plan, "feed_forward">> feed_forward;
  SHARDWISE_CHILDREN(feed_forward)
};
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
                      sw::at<"feed_forward.w1", sw::ColwiseParallel<>>>;
auto use(Model<float, plan>& model, sw::Activation<float, sw::Shard<0>> const& x) {
#ifdef SHARDWISE_SHOULD_FAIL
  return model.feed_forward.forward(x);  // skips the entry: w1 gets the sequence-cut input
#else
  return sw::forward(model.feed_forward, x);
#endif
}
