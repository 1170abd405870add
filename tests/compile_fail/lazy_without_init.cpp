// sw::Lazy needs an sw::init among the model's constructor arguments: without one the layers cannot know they
// are only declared, and the model would be built with all its parameters.
#include <cstdint>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/nn.hpp>
namespace sw = shardwise;
struct Block {
  sw::Linear<float> w;
  SHARDWISE_CHILDREN(w)
  explicit Block(sw::init seed) : w(8, 8, seed + 1) {}
};
void declare() {
#ifdef SHARDWISE_SHOULD_FAIL
  sw::Lazy<Block> lazy(std::uint64_t{7});  // a plain integer: converted to an eager init inside Block
#else
  sw::Lazy<Block> lazy(sw::init(7));
#endif
  (void)lazy;
}
