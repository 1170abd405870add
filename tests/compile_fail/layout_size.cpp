#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh, Eigen::MatrixXf const& m) {
#ifdef SHARDWISE_SHOULD_FAIL
  auto d = sw::distribute<sw::Layout<sw::Shard<0>>>(mesh, m);
#else
  auto d = sw::distribute<sw::Layout<sw::Shard<0>, sw::Replicate>>(mesh, m);
#endif
  (void)d;
}
