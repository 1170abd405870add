#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh, Eigen::MatrixXf& m) {
#ifdef SHARDWISE_SHOULD_FAIL
  sw::all_reduce(mesh, m);
#else
  sw::all_reduce(mesh.axis<"tp">(), m);
#endif
}
