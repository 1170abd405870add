// sw::forward on a model declared with sw::Lazy (its parameters not materialized) is refused with the fix.
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/nn.hpp>
namespace sw = shardwise;
struct Block {
  sw::Linear<float> w{8, 8, 1};
  SHARDWISE_CHILDREN(w)
  Eigen::MatrixXf forward(Eigen::MatrixXf const& x) { return x; }
};
void use(sw::Lazy<Block>& lazy, Eigen::MatrixXf const& x) {
#ifdef SHARDWISE_SHOULD_FAIL
  sw::forward(lazy, x);  // the materialized model is discarded: the lazy one has no parameters
#else
  (void)sw::forward(sw::materialize(lazy), x);
#endif
}
