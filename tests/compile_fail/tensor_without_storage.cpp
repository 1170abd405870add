// A type with tensor_traits that give a shape but no data(t): the concept says storage is what it lacks.
#include <shardwise/shardwise.hpp>
#include <vector>
namespace sw = shardwise;
struct TableWithoutData {
  std::vector<float> values;
};
template <>
struct shardwise::tensor_traits<TableWithoutData> {
  using element_type = float;
  static constexpr std::size_t rank = 1;
  static constexpr storage_order order = storage_order::row_major;
  static extents shape(TableWithoutData const& m) { return {m.values.size()}; }
#ifndef SHARDWISE_SHOULD_FAIL
  static float* data(TableWithoutData& m) { return m.values.data(); }
  static float const* data(TableWithoutData const& m) { return m.values.data(); }
#endif
};
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, TableWithoutData& m) { sw::all_reduce(mesh, m); }
