// shardwise::separate_runtime: sw::launch's RuntimeComm split, barrier and collectives for float and double,
// compiled once for every file that links the target (which then declares them extern: SHARDWISE_SEPARATE_RUNTIME).
// docs/build-time.md says why.
#include <shardwise/mesh/compile_runtime.hpp>
