// The tensor concept, extents, torch.chunk sizes and box copies.
#include <doctest/doctest.h>

#include <shardwise/adapters/eigen.hpp>
#include <shardwise/adapters/xtensor.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "support/convert.hpp"

namespace sw = shardwise;

struct NotATensor {};
struct HasTraitsButNoData {};
template <>
struct shardwise::tensor_traits<HasTraitsButNoData> {
  using element_type = float;
  static constexpr std::size_t rank = 1;
  static constexpr storage_order order = storage_order::row_major;
  static extents shape(HasTraitsButNoData const&) { return {1}; }
};

// What each part of the concept accepts and rejects: the named parts say which requirement is missing.
static_assert(!sw::tensor<NotATensor> && !sw::tensor_has_traits<NotATensor>);
static_assert(sw::tensor_has_shape<HasTraitsButNoData> && !sw::tensor_has_storage<HasTraitsButNoData>);
static_assert(!sw::tensor<HasTraitsButNoData>);
static_assert(!sw::tensor<std::vector<float>> && !sw::tensor<float>);
static_assert(sw::creatable_tensor<Eigen::MatrixXf> && sw::creatable_tensor<xt::xarray<double>>);
static_assert(sw::tensor<Eigen::Map<Eigen::MatrixXf>> && !sw::creatable_tensor<Eigen::Map<Eigen::MatrixXf>>);

TEST_CASE("torch.chunk sizes, as PyTorch documents them") {
  // torch.chunk(torch.arange(5), 4) -> sizes 2, 2, 1 and no fourth chunk (an empty shard here).
  std::vector<std::size_t> sizes;
  for (std::size_t i = 0; i < 4; ++i) sizes.push_back(sw::chunk_size(5, 4, i));
  CHECK(sizes == std::vector<std::size_t>{2, 2, 1, 0});
  // torch.chunk(torch.arange(6), 4) -> 2, 2, 2: ceil(6 / 4) = 2, so only three chunks.
  sizes.clear();
  for (std::size_t i = 0; i < 4; ++i) sizes.push_back(sw::chunk_size(6, 4, i));
  CHECK(sizes == std::vector<std::size_t>{2, 2, 2, 0});
  for (std::size_t total : {0u, 1u, 7u, 12u, 13u})
    for (std::size_t pieces : {1u, 2u, 3u, 4u, 5u}) {
      auto const expected = ref::torch_chunk_sizes(total, pieces);
      std::size_t offset = 0;
      for (std::size_t i = 0; i < pieces; ++i) {
        CHECK(sw::chunk_size(total, pieces, i) == expected[i]);
        CHECK(sw::chunk_offset(total, pieces, i) == offset);
        offset += expected[i];
      }
    }
}

TEST_CASE("extents") {
  sw::extents const e{2, 3, 4};
  CHECK(e.rank == 3);
  CHECK(e.elements() == 24);
  CHECK(e == sw::extents{2, 3, 4});
  CHECK(!(e == sw::extents{2, 3}));
  std::ostringstream out;
  out << e;
  CHECK(out.str() == "[2, 3, 4]");
  CHECK_THROWS_AS((sw::extents{1, 1, 1, 1, 1, 1, 1, 1, 1}), sw::error);
}

TEST_CASE("copy_box moves a sub-block between tensors of either storage order") {
  auto const source = ref::pattern({4, 5, 6}, 1);
  for (auto order : {sw::storage_order::row_major, sw::storage_order::col_major}) {
    CAPTURE(order == sw::storage_order::row_major);
    // Flatten in the given order with plain loops.
    auto flatten = [&](ref::Array const& a) {
      std::vector<double> flat(a.size());
      for (std::size_t f = 0; f < a.size(); ++f) {
        auto idx = a.unflat(f);
        std::size_t pos = 0;
        if (order == sw::storage_order::row_major)
          for (std::size_t d = 0; d < idx.size(); ++d) pos = pos * a.shape[d] + idx[d];
        else
          for (std::size_t d = idx.size(); d-- > 0;) pos = pos * a.shape[d] + idx[d];
        flat[pos] = a.values[f];
      }
      return flat;
    };
    auto const src = flatten(source);
    sw::extents const box_size{2, 3, 4}, src_offset{1, 2, 1}, dst_offset{0, 1, 2};
    auto dst_array = ref::Array::zeros({3, 4, 7});
    auto dst = flatten(dst_array);
    sw::detail::copy_box(src.data(), sw::extents{4, 5, 6}, src_offset, dst.data(), sw::extents{3, 4, 7}, dst_offset,
                         box_size, order);
    for (std::size_t f = 0; f < dst_array.size(); ++f) {
      auto idx = dst_array.unflat(f);
      bool inside = true;
      std::vector<std::size_t> from(3);
      for (std::size_t d = 0; d < 3; ++d) {
        inside = inside && idx[d] >= dst_offset[d] && idx[d] < dst_offset[d] + box_size[d];
        from[d] = idx[d] - dst_offset[d] + src_offset[d];
      }
      dst_array.values[f] = inside ? source.at(from) : 0.0;
    }
    CHECK(dst == flatten(dst_array));
  }
}
