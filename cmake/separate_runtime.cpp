// shardwise::separate_runtime: sw::launch's RuntimeComm's MPI side, and both backends' collectives for float and
// double, compiled once for every file that links the target (SHARDWISE_SEPARATE_RUNTIME: they parse no MPI header).
// docs/build-time.md says why.
#include <shardwise/mesh/compile_runtime.hpp>
