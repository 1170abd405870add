// tensor_traits for Eigen and xtensor: what shardwise reads of each type agrees with the library's own view.
#include <doctest/doctest.h>

#include <shardwise/adapters/eigen.hpp>
#include <shardwise/adapters/xtensor.hpp>
#include <shardwise/shardwise.hpp>
#include <unsupported/Eigen/CXX11/Tensor>

namespace sw = shardwise;
using RowMajorXf = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

static_assert(sw::rank_v<Eigen::MatrixXf> == 2 && sw::rank_v<Eigen::VectorXf> == 1 &&
              sw::rank_v<Eigen::RowVectorXd> == 1 && sw::rank_v<Eigen::Matrix4f> == 2);
static_assert(sw::detail::traits_of<Eigen::MatrixXf>::order == sw::storage_order::col_major);
static_assert(sw::detail::traits_of<RowMajorXf>::order == sw::storage_order::row_major);
static_assert(std::is_same_v<sw::element_t<Eigen::Matrix<Eigen::bfloat16, 2, 3>>, Eigen::bfloat16>);
static_assert(sw::rank_v<Eigen::Tensor<float, 4>> == 4 && sw::rank_v<xt::xtensor<double, 3>> == 3);
static_assert(sw::rank_v<xt::xarray<float>> == sw::dynamic_rank);
static_assert(sw::detail::traits_of<xt::xtensor<float, 2, xt::layout_type::column_major>>::order ==
              sw::storage_order::col_major);
static_assert(sw::detail::traits_of<Eigen::Tensor<float, 3, Eigen::RowMajor>>::order == sw::storage_order::row_major);

template <class T>
void check_element_positions(T& t, sw::extents const& expected_shape, auto&& at_index) {
  CHECK(sw::shape_of(t) == expected_shape);
  auto* data = sw::data_of(t);
  // Storage order: the element at a given index sits where the order says.
  bool const row_major = sw::detail::traits_of<T>::order == sw::storage_order::row_major;
  std::size_t const rows = expected_shape[0], cols = expected_shape.rank > 1 ? expected_shape[1] : 1;
  for (std::size_t i = 0; i < rows; ++i)
    for (std::size_t j = 0; j < cols; ++j) {
      std::size_t const pos = row_major ? i * cols + j : j * rows + i;
      CHECK(&at_index(i, j) == data + pos);
    }
}

TEST_CASE("Eigen matrices, vectors and maps") {
  Eigen::MatrixXf m(3, 4);
  check_element_positions(m, {3, 4}, [&](std::size_t i, std::size_t j) -> float& { return m(i, j); });
  RowMajorXf r(3, 4);
  check_element_positions(r, {3, 4}, [&](std::size_t i, std::size_t j) -> float& { return r(i, j); });
  Eigen::RowVectorXd v(5);
  CHECK(sw::shape_of(v) == sw::extents{5});
  Eigen::Map<Eigen::MatrixXf> map(m.data(), 3, 4);
  CHECK(sw::shape_of(map) == sw::extents{3, 4});
  CHECK(sw::data_of(map) == m.data());

  auto made = sw::make_tensor<Eigen::MatrixXf>({2, 7});
  CHECK(made.rows() == 2);
  CHECK(made.cols() == 7);
  auto vec = sw::make_tensor<Eigen::RowVectorXf>({6});
  CHECK(vec.cols() == 6);
  auto fixed = sw::make_tensor<Eigen::Matrix<float, 2, 3>>({2, 3});
  CHECK(sw::shape_of(fixed) == sw::extents{2, 3});
  CHECK_THROWS_WITH_AS((sw::make_tensor<Eigen::Matrix<float, 2, 3>>({3, 3})),
                       doctest::Contains("a fixed-size 2x3 matrix cannot have shape [3, 3]"), sw::error);
  CHECK_THROWS_WITH_AS((sw::make_tensor<Eigen::MatrixXf>({3})), doctest::Contains("cannot make a rank-2"), sw::error);
  auto bf = sw::make_tensor<Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic>>({2, 2});
  CHECK(bf.size() == 4);
}

TEST_CASE("a Map is written in place by a collective, and must already have the right shape") {
  sw::run_threads(2, [](auto& world) {
    auto mesh = sw::make_mesh<"tp">(world, {2});
    std::vector<float> storage(8, 0.0f), wrong(6, 0.0f);
    Eigen::VectorXf mine = Eigen::VectorXf::Constant(4, float(world.rank() + 1));
    Eigen::Map<Eigen::VectorXf> out(storage.data(), 8);
    sw::all_gather(mesh, mine, out, 0);
    CHECK(storage == std::vector<float>{1, 1, 1, 1, 2, 2, 2, 2});
    Eigen::Map<Eigen::VectorXf> too_small(wrong.data(), 6);
    CHECK_THROWS_WITH_AS(sw::all_gather(mesh, mine, too_small, 0),
                         "shardwise::all_gather on mesh axis \"tp\": the output has shape [6] but must have [8]; pass "
                         "an output of that shape, or an owning tensor type shardwise can resize",
                         sw::error);
  });
}

TEST_CASE("Eigen::Tensor and xtensor") {
  Eigen::Tensor<float, 3> t(2, 3, 4);
  CHECK(sw::shape_of(t) == sw::extents{2, 3, 4});
  CHECK(&t(1, 0, 0) == sw::data_of(t) + 1);  // column-major: the first index is contiguous
  Eigen::Tensor<float, 3, Eigen::RowMajor> tr(2, 3, 4);
  CHECK(&tr(0, 0, 1) == sw::data_of(tr) + 1);
  auto made = sw::make_tensor<Eigen::Tensor<double, 2>>({5, 6});
  CHECK(made.dimension(1) == 6);

  xt::xtensor<float, 3> x({2, 3, 4});
  CHECK(sw::shape_of(x) == sw::extents{2, 3, 4});
  CHECK(&x(0, 0, 1) == sw::data_of(x) + 1);
  xt::xtensor<float, 2, xt::layout_type::column_major> xc({2, 3});
  CHECK(&xc(1, 0) == sw::data_of(xc) + 1);
  xt::xarray<double> a = xt::zeros<double>({4, 1, 2, 3});
  CHECK(sw::shape_of(a) == sw::extents{4, 1, 2, 3});
  auto made_array = sw::make_tensor<xt::xarray<float>>({3, 2});
  CHECK(made_array.dimension() == 2);
  CHECK_THROWS_WITH_AS((sw::make_tensor<xt::xtensor<float, 2>>({3})), doctest::Contains("cannot make a rank-2"),
                       sw::error);
}
