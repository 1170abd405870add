#include <shardwise/nn/prepare.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using from = sw::Partial<sw::Sum>;  // a reduction is RowwiseParallel's output_layouts, not a Prepare's
#else
using from = sw::Shard<0>;
#endif
using plan = sw::plan<sw::at<"ffn", sw::PrepareModuleInput<from, sw::Replicate>>>;
auto use(sw::Prepare<float, sw::style_at<plan, "ffn">> const& prepare, sw::Activation<float, from> const& x) {
  return prepare.input(x);
}
