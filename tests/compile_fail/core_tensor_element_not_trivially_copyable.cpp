// A tensor type whose tensor_traits give std::string elements: shardwise moves elements as bytes.
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/thread/comm.hpp>
#include <string>
#include <vector>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Element = std::string;
#else
using Element = float;
#endif
struct Column {
  std::vector<Element> values;
};
template <>
struct shardwise::tensor_traits<Column> {
  using element_type = Element;
  static constexpr std::size_t rank = 1;
  static constexpr storage_order order = storage_order::row_major;
  static extents shape(Column const& c) { return {c.values.size()}; }
  static Element* data(Column& c) { return c.values.data(); }
  static Element const* data(Column const& c) { return c.values.data(); }
};
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Column& c) { sw::broadcast(mesh, c); }
