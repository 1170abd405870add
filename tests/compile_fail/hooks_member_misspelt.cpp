// A hook listed in SHARDWISE_HOOKS must be defined: a misspelt member is not skipped without a word.
#include <shardwise/nn.hpp>
namespace sw = shardwise;
struct Heads {
  sw::Linear<float> wq{8, 8, 1};
  SHARDWISE_CHILDREN(wq)
  SHARDWISE_HOOKS(on_parallelize)
#ifdef SHARDWISE_SHOULD_FAIL
  void shardwise_on_paralelize(int) {}  // misspelt: parallelize would never call it
#else
  void shardwise_on_parallelize(int) {}
#endif
};
void use(Heads& heads) {
  sw::for_each_parameter(heads, [](auto const&, auto const&) {});
}
