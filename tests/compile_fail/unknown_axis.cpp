#include <shardwise/shardwise.hpp>
namespace sw = shardwise;
void use(sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh) {
#ifdef SHARDWISE_SHOULD_FAIL
  auto pp = mesh.axis<"pp">();
#else
  auto pp = mesh.axis<"tp">();
#endif
  (void)pp;
}
