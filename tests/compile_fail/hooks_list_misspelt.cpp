// SHARDWISE_HOOKS names only hooks that exist (shardwise::hooks): a misspelt entry does not compile.
#include <shardwise/nn.hpp>
namespace sw = shardwise;
struct Heads {
  sw::Linear<float> wq{8, 8, 1};
  SHARDWISE_CHILDREN(wq)
#ifdef SHARDWISE_SHOULD_FAIL
  SHARDWISE_HOOKS(on_paralelize)
#else
  SHARDWISE_HOOKS(on_parallelize)
#endif
  void shardwise_on_parallelize(int) {}
};
void use(Heads& heads) {
  sw::for_each_parameter(heads, [](auto const&, auto const&) {});
}
