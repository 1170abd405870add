#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Eigen::MatrixXf const& m) {
#ifdef SHARDWISE_SHOULD_FAIL
  auto d = sw::distribute<sw::Layout<sw::Shard<-3>>>(mesh, m);  // a matrix has dimensions 0, 1 (or -2, -1)
#else
  auto d = sw::distribute<sw::Layout<sw::Shard<-2>>>(mesh, m);
#endif
  (void)d;
}
