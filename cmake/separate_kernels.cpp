// shardwise::separate_kernels: the nn kernels for float and double, compiled once for every file that links the
// target (which then declares them extern: SHARDWISE_SEPARATE_KERNELS). docs/build-time.md says why.
#include <shardwise/compile_kernels.hpp>
