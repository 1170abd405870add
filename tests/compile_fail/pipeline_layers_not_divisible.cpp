// Six layers over four static stages do not divide: a compile error naming the counts.
#include <shardwise/pipeline/stages.hpp>
namespace sw = shardwise;
int main() {
#ifdef SHARDWISE_SHOULD_FAIL
  auto const split = sw::even_stage_split<6, 4>();
#else
  auto const split = sw::even_stage_split<8, 4>();
#endif
  return split.stages() == 4 ? 0 : 1;
}
