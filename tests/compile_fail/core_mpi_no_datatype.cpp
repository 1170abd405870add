// A broadcast of long double over MPI: MPI has no datatype shardwise maps it to.
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/mpi/comm.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Matrix = Eigen::Matrix<long double, Eigen::Dynamic, Eigen::Dynamic>;
#else
using Matrix = Eigen::MatrixXd;
#endif
void use(sw::Mesh<sw::MpiComm, sw::axis<"tp">> const& mesh, Matrix& m) { sw::broadcast(mesh, m); }
