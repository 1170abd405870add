// A model declared with sw::Lazy has no backward until it is materialized: calling it is a compile error.
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
using Model = shardwise::models::Llama<float>;
void use(sw::Lazy<Model>& lazy, Eigen::MatrixXf const& dlogits) {
#ifdef SHARDWISE_SHOULD_FAIL
  lazy.backward(dlogits);
#else
  sw::materialize(lazy).backward(sw::Activation<float, sw::Replicate>{dlogits});
#endif
}
