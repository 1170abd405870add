#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
void use(sw::DTensor<Eigen::MatrixXf, sw::Mesh<sw::ThreadComm, sw::axis<"tp">>, sw::Layout<sw::Shard<0>>> const& d) {
#ifdef SHARDWISE_SHOULD_FAIL
  auto p = d.redistribute<sw::Layout<sw::Partial<>>>();
#else
  auto p = d.redistribute<sw::Layout<sw::Replicate>>();
#endif
  (void)p;
}
