// An all-gather from float into double: input and output must hold the same element type.
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/thread/comm.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Eigen::MatrixXf const& in) {
#ifdef SHARDWISE_SHOULD_FAIL
  Eigen::MatrixXd out;
#else
  Eigen::MatrixXf out;
#endif
  sw::all_gather(mesh, in, out, 0);
}
