// A collective called with something that is not a mesh as its first argument (here the rank count).
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/thread/comm.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Eigen::MatrixXf& m) {
#ifdef SHARDWISE_SHOULD_FAIL
  sw::all_reduce(mesh.size(0), m);
#else
  sw::all_reduce(mesh, m);
#endif
}
