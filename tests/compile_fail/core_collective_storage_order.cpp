// A reduce-scatter from a row-major into a column-major matrix: both must have the same storage order.
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/thread/comm.hpp>
namespace sw = shardwise;
using RowMajorMatrix = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, RowMajorMatrix const& in) {
#ifdef SHARDWISE_SHOULD_FAIL
  Eigen::MatrixXf out;
#else
  RowMajorMatrix out;
#endif
  sw::reduce_scatter(mesh, in, out, 0);
}
