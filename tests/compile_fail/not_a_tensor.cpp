#include <shardwise/shardwise.hpp>
#include <vector>
namespace sw = shardwise;
struct MyMatrix {
  std::vector<float> values;
};
#ifndef SHARDWISE_SHOULD_FAIL
template <>
struct shardwise::tensor_traits<MyMatrix> {
  using element_type = float;
  static constexpr std::size_t rank = 1;
  static constexpr storage_order order = storage_order::row_major;
  static extents shape(MyMatrix const& m) { return {m.values.size()}; }
  static float* data(MyMatrix& m) { return m.values.data(); }
  static float const* data(MyMatrix const& m) { return m.values.data(); }
};
#endif
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, MyMatrix& m) { sw::all_reduce(mesh, m); }
