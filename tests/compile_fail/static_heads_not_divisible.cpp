#include "../../examples/blocks.hpp"
namespace sw = shardwise;
template <class T, class Plan>
struct Model {
#ifdef SHARDWISE_SHOULD_FAIL
  blocks::Attention<T, sw::subplan<Plan, "attention">, 6> attention;  // 6 heads over 4 ranks
#else
  blocks::Attention<T, sw::subplan<Plan, "attention">, 8> attention;
#endif
  SHARDWISE_CHILDREN(attention)
};
using plan = sw::plan<sw::at<"attention.wq", sw::ColwiseParallel<>>, sw::at<"attention.wk", sw::ColwiseParallel<>>,
                      sw::at<"attention.wv", sw::ColwiseParallel<>>, sw::at<"attention.wo", sw::RowwiseParallel<>>>;
template <class M>
void use(M& model, sw::Mesh<sw::ThreadComm, sw::axis<"tp", 4>> const& tp) {
  sw::parallelize(model, tp);
}
template void use(Model<float, plan>&, sw::Mesh<sw::ThreadComm, sw::axis<"tp", 4>> const&);
