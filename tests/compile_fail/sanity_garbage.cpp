// The machinery's own check: the bad twin is not C++ at all, so it must fail; the good twin must build.
#include <shardwise/shardwise.hpp>
#ifdef SHARDWISE_SHOULD_FAIL
this_is_not_cpp shardwise_compile_fail_sanity;
#else
int shardwise_compile_fail_sanity = 0;
#endif
