// Tensor parallelism on the thread mesh at TP 1, 2 and 4, in fp64 and fp32; test_mpi_nn.cpp runs the same
// cases under mpiexec.
#include <doctest/doctest.h>

#include "cases/nn_cases.hpp"

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, fp64, thread mesh") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto& world) { nn_cases::check_all<double>(world); });
  }
}

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, fp32, thread mesh") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto& world) { nn_cases::check_all<float>(world); });
  }
}

// A layer type of the user's own joins plans and parallelize through sw::layer_traits.
namespace user {
template <class Location>
struct MyLinear {  // the user's own: a weight [out, in] and nothing shardwise-specific
  Eigen::MatrixXd weight;
};
template <class Plan>
struct Model {
  MyLinear<shardwise::style_at<Plan, "proj">> proj;
  SHARDWISE_CHILDREN(proj)
};
}  // namespace user

template <class Location>
struct shardwise::layer_traits<user::MyLinear<Location>> {
  using location = Location;
  template <class Mesh>
  static void parallelize(user::MyLinear<Location>& layer, Mesh const& tp) {
    static_assert(is_colwise_v<typename Location::style>, "this user layer only knows ColwiseParallel");
    auto const rows = layer.weight.rows() / tp.size();
    layer.weight = Eigen::MatrixXd(layer.weight.middleRows(tp.rank() * rows, rows));
  }
};

TEST_CASE("a user-defined layer joins through layer_traits, and its plan entry is checked like any other") {
  using plan = shardwise::plan<shardwise::at<"proj", shardwise::ColwiseParallel<>>>;
  static_assert(shardwise::layer<user::MyLinear<shardwise::style_at<plan, "proj">>>);
  static_assert(shardwise::detail::has_layer_at<user::Model<plan>>("proj"));
  static_assert(!shardwise::detail::has_layer_at<user::Model<plan>>("projection"));
  Eigen::MatrixXd full(8, 4);
  for (Eigen::Index i = 0; i < full.size(); ++i) full.data()[i] = double(i);
  Eigen::MatrixXd const x = Eigen::MatrixXd::Ones(3, 4);
  shardwise::run_threads(4, [&](auto& world) {
    auto tp = shardwise::make_mesh<"tp">(world, {4});
    user::Model<plan> model{{full}};
    shardwise::parallelize(model, tp);
    CHECK(model.proj.weight.rows() == 2);
    Eigen::MatrixXd const y_local = x * model.proj.weight.transpose();
    Eigen::MatrixXd y;
    shardwise::all_gather(tp, y_local, y, -1);
    CHECK((y - x * full.transpose()).norm() == 0.0);
  });
}

#include <shardwise/adapters/xtensor.hpp>

TEST_CASE("layers take xtensor inputs: the same results as from an Eigen matrix, at TP 1, 2 and 4") {
  using T = double;
  nn_cases::M<T> const x = nn_cases::random_matrix<T>(8, 8, 21);
  xt::xtensor<T, 2> x_xt({8, 8});
  for (std::size_t i = 0; i < 8; ++i)
    for (std::size_t j = 0; j < 8; ++j) x_xt(i, j) = x(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j));
  static_assert(shardwise::detail::layer_input_v<T, xt::xtensor<T, 2>>);
  static_assert(!shardwise::detail::layer_input_v<T, xt::xtensor<T, 2, xt::layout_type::column_major>>);
  static_assert(!shardwise::detail::layer_input_v<T, Eigen::MatrixXd>);  // column-major: not [tokens, features] rows
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    shardwise::run_threads(n, [&](auto& world) {
      auto tp = shardwise::make_mesh<"tp">(world, {n});
      blocks::FeedForward<T, nn_cases::feed_forward_plan> from_eigen(8, 16, 30), from_xtensor(8, 16, 30);
      shardwise::parallelize(from_eigen, tp);
      shardwise::parallelize(from_xtensor, tp);
      CHECK((from_xtensor.forward(x_xt).local - from_eigen.forward(x).local).norm() == 0.0);
      shardwise::RMSNorm<T> norm(8);
      CHECK((norm(x_xt).local - norm(x).local).norm() == 0.0);
    });
  }
}
