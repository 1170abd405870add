// Interleaved 1F1B runs microbatches in groups of one per stage: 6 microbatches on 4 stages cannot be run.
#include <shardwise/pipeline/schedule.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
template struct sw::checked_schedule<sw::Interleaved1F1B<2>, 4, 6>;
#else
template struct sw::checked_schedule<sw::Interleaved1F1B<2>, 4, 8>;
#endif
