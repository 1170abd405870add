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
#ifdef SHARDWISE_SHOULD_FAIL
using said = sw::Shard<0>;  // the module's ColwiseParallel output comes cut by features, not by the sequence
#else
using said = sw::Shard<-1>;
#endif
using plan = sw::plan<sw::at<"feed_forward", sw::PrepareModuleOutput<said, sw::Replicate>>,
                      sw::at<"feed_forward.w1", sw::ColwiseParallel<>>>;
auto use(Model<float, plan>& model, sw::nn::matrix<float> const& x) { return sw::forward(model.feed_forward, x); }
