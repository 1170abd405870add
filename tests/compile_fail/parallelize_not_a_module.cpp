// parallelize on a type that lists no children (no SHARDWISE_CHILDREN) is refused with the fix.
#include <shardwise/nn.hpp>
#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
struct Block {
  sw::Linear<float> w{8, 8, 1};
#ifndef SHARDWISE_SHOULD_FAIL
  SHARDWISE_CHILDREN(w)
#endif
};
void use(Block& block) {
  auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1}));
  sw::parallelize(block, tp);
}
