#include <shardwise/nn/prepare.hpp>
namespace sw = shardwise;
using plan = sw::plan<sw::at<"ffn", sw::PrepareModuleOutput<sw::Shard<0>, sw::Replicate>>>;
#ifdef SHARDWISE_SHOULD_FAIL
using given = sw::Shard<-1>;
#else
using given = sw::Shard<-2>;  // the same layout as Shard<0> on [tokens, features]
#endif
auto use(sw::Prepare<float, sw::style_at<plan, "ffn">> const& prepare, sw::Activation<float, given> const& y) {
  return prepare.output(y);
}
