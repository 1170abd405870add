// A hook a module defines must be listed in SHARDWISE_HOOKS, so that a list is always there to check against.
#include <shardwise/nn.hpp>
namespace sw = shardwise;
struct Heads {
  sw::Linear<float> wq{8, 8, 1};
  SHARDWISE_CHILDREN(wq)
#ifndef SHARDWISE_SHOULD_FAIL
  SHARDWISE_HOOKS(on_parallelize)
#endif
  void shardwise_on_parallelize(int) {}
};
void use(Heads& heads) {
  sw::for_each_parameter(heads, [](auto const&, auto const&) {});
}
