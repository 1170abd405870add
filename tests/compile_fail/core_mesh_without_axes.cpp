// A mesh type with no named axis.
#include <shardwise/mesh/mesh.hpp>
#include <shardwise/mesh/thread/comm.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Grid = sw::Mesh<sw::ThreadComm>;
#else
using Grid = sw::Mesh<sw::ThreadComm, sw::axis<"tp">>;
#endif
int ranks(Grid const& mesh) { return mesh.size(0); }
