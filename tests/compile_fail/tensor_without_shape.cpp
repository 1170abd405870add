// A type with tensor_traits that give storage but no shape(t): the concept says the shape is what it lacks.
#include <shardwise/shardwise.hpp>
#include <vector>
namespace sw = shardwise;
struct TableWithoutShape {
  std::vector<float> values;
};
template <>
struct shardwise::tensor_traits<TableWithoutShape> {
  using element_type = float;
  static constexpr std::size_t rank = 1;
  static constexpr storage_order order = storage_order::row_major;
#ifndef SHARDWISE_SHOULD_FAIL
  static extents shape(TableWithoutShape const& m) { return {m.values.size()}; }
#endif
  static float* data(TableWithoutShape& m) { return m.values.data(); }
  static float const* data(TableWithoutShape const& m) { return m.values.data(); }
};
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, TableWithoutShape& m) { sw::all_reduce(mesh, m); }
