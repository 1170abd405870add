#include <shardwise/nn/prepare.hpp>
namespace sw = shardwise;
using plan = sw::plan<sw::at<"ffn", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>>;
#ifdef SHARDWISE_SHOULD_FAIL
using given = sw::Replicate;
#else
using given = sw::Shard<0>;
#endif
auto use(sw::Prepare<float, sw::style_at<plan, "ffn">> const& prepare, sw::Activation<float, given> const& x) {
  return prepare.input(x);
}
