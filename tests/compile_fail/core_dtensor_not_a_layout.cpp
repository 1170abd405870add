// distribute given a bare placement instead of shardwise::Layout<...>.
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/dtensor/dtensor.hpp>
#include <shardwise/mesh/thread/comm.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Eigen::MatrixXf const& m) {
#ifdef SHARDWISE_SHOULD_FAIL
  auto d = sw::distribute<sw::Shard<0>>(mesh, m);
#else
  auto d = sw::distribute<sw::Layout<sw::Shard<0>>>(mesh, m);
#endif
  (void)d;
}
