#include <shardwise/nn/layers/linear.hpp>
#include <shardwise/plan/module.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct Model {
  sw::Linear<T, sw::layer_at<Plan, "w1">> w1;
  SHARDWISE_CHILDREN(w1)
};
using plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>>;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh, Model<float, plan>& model) {
#ifdef SHARDWISE_SHOULD_FAIL
  sw::parallelize(model, mesh);
#else
  sw::parallelize(model, mesh.axis<"tp">());
#endif
}
