// An all-gather from a vector (rank 1) into a matrix (rank 2): input and output must have the same rank.
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/thread/comm.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Eigen::VectorXf const& in) {
#ifdef SHARDWISE_SHOULD_FAIL
  Eigen::MatrixXf out;
#else
  Eigen::VectorXf out;
#endif
  sw::all_gather(mesh, in, out, 0);
}
