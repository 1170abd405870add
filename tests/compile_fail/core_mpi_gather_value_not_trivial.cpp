// MpiComm::all_gather_value sends its value as bytes: a std::string is refused.
#include <shardwise/mesh/mpi/comm.hpp>
#include <string>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Value = std::string;
#else
using Value = long;
#endif
std::size_t count(sw::MpiComm const& comm, Value const& v) { return comm.all_gather_value(v).size(); }
