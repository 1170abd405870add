#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Eigen::Map<Eigen::MatrixXf> const& view,
         Eigen::MatrixXf const& owned) {
#ifdef SHARDWISE_SHOULD_FAIL
  auto d = sw::distribute<sw::Layout<sw::Shard<0>>>(mesh, view);
#else
  auto d = sw::distribute<sw::Layout<sw::Shard<0>>>(mesh, owned);
#endif
  (void)d;
  (void)view;
}
