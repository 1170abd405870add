// A batch of 6 sequences cannot be cut into 4 equal microbatches: with static counts, a compile error naming them.
#include <shardwise/pipeline/stages.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
constexpr std::size_t rows = sw::microbatch_rows<6, 4>();
#else
constexpr std::size_t rows = sw::microbatch_rows<8, 4>();
#endif
int main() { return rows == 2 ? 0 : 1; }
