#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
void use(sw::ThreadComm const& world) {
#ifdef SHARDWISE_SHOULD_FAIL
  auto mesh = sw::make_mesh<"tp", "tp">(world, {2, 2});
#else
  auto mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
#endif
  (void)mesh;
}
