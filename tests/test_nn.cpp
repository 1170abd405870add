// Tensor parallelism on the thread mesh at TP 1, 2 and 4, in fp64 and fp32; test_mpi_nn.cpp runs the same
// cases under mpiexec.
#include <doctest/doctest.h>

#include "cases/expert_parallel_cases.hpp"
#include "cases/nn_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, fp64, thread mesh") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    worlds::run_threads(n, [](auto& world) { nn_cases::check_all<double>(world); });
  }
}

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, fp32, thread mesh") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    worlds::run_threads(n, [](auto& world) { nn_cases::check_all<float>(world); });
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
  MyLinear<shardwise::layer_at<Plan, "proj">> proj;
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
  static_assert(shardwise::layer<user::MyLinear<shardwise::layer_at<plan, "proj">>>);
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

// A Linear given its input as a temporary (model code: `w2(a * b)`, `wo(std::move(out))`) keeps that storage for
// backward instead of a copy, where it keeps the input as given; where it gathers the sequence or cuts columns,
// it copies as before. Either way the outputs and gradients are those of the same input given by reference.
namespace moved_input {
template <class T, class Plan>
struct Model {
  shardwise::Linear<T, shardwise::layer_at<Plan, "up">> up;
  shardwise::Linear<T, shardwise::layer_at<Plan, "down">> down;
  SHARDWISE_CHILDREN(up, down)
  Model() : up(8, 12, 40), down(12, 8, 41) {}
};
using tensor_parallel = shardwise::plan<shardwise::at<"up", shardwise::ColwiseParallel<>>,
                                        shardwise::at<"down", shardwise::RowwiseParallel<>>>;
using sequence_parallel = shardwise::plan<shardwise::at<"up", shardwise::ColwiseParallel<shardwise::Shard<0>>>,
                                          shardwise::at<"down", shardwise::RowwiseParallel<>>>;
}  // namespace moved_input

TEST_CASE("a Linear given a temporary input keeps its storage, not a copy: the same outputs and gradients") {
  using T = double;
  nn_cases::M<T> const x = nn_cases::random_matrix<T>(8, 8, 42), dy = nn_cases::random_matrix<T>(8, 8, 43);
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    shardwise::run_threads(n, [&](auto& world) {
      auto tp = shardwise::make_mesh<"tp">(world, {n});
      auto const check = [&]<class Plan>(Plan, nn_cases::M<T> const& input, bool taken) {
        moved_input::Model<T, Plan> by_reference, by_value;
        shardwise::parallelize(by_reference, tp);
        shardwise::parallelize(by_value, tp);
        auto const hidden = by_reference.up(input);
        auto const y = by_reference.down(hidden);
        nn_cases::M<T> given = input;
        T const* const given_storage = given.data();
        auto hidden_moved = by_value.up(std::move(given));
        T const* const hidden_storage = hidden_moved.local.data();
        auto const y_moved = by_value.down(std::move(hidden_moved));
        auto const kept = [](auto& layer) { return std::get<0>(layer.shardwise_saved()).data(); };
        CHECK((kept(by_value.up) == given_storage) == taken);  // the caller's storage, or a gathered copy
        CHECK(given.size() == (taken ? 0 : input.size()));     // NOLINT(bugprone-use-after-move): what it left
        CHECK(kept(by_value.down) == hidden_storage);          // Shard<-1> in: kept as given, so taken
        CHECK((y_moved.local - y.local).norm() == 0.0);
        shardwise::Activation<T, shardwise::Replicate> const gradient{dy};
        auto const dx = by_reference.up.backward(by_reference.down.backward(gradient));
        auto const dx_moved = by_value.up.backward(by_value.down.backward(gradient));
        CHECK((dx_moved.local - dx.local).norm() == 0.0);
        CHECK((by_value.up.weight_grad - by_reference.up.weight_grad).norm() == 0.0);
        CHECK((by_value.down.weight_grad - by_reference.down.weight_grad).norm() == 0.0);
      };
      check(moved_input::tensor_parallel{}, x, true);
      // Under sequence parallelism `up` gathers the sequence from this rank's rows: the rows stay the caller's.
      auto const rows = 8 / n;
      check(moved_input::sequence_parallel{}, nn_cases::M<T>(x.middleRows(tp.rank() * rows, rows)), false);
    });
  }
}

TEST_CASE("an attention's heads built with another count than declared, or not splitting the features, are refused") {
  using plan = nn_cases::attention_plan;
  CHECK_THROWS_WITH_AS((blocks::Attention<float, plan, 4>(8, 2, 4, 40)),
                       "shardwise::attention_heads at \"\": declared with 4 heads but built with 2; build it with the "
                       "declared count or declare this one",
                       shardwise::error);
  CHECK_THROWS_WITH_AS((blocks::Attention<float, plan>(8, 3, 4, 40)),
                       "shardwise::attention_heads at \"\": 8 features do not split into 3 heads; choose a head count "
                       "that divides the features",
                       shardwise::error);
  blocks::Attention<float, plan, 4> declared(8, 4, 4, 40);  // as declared: 4 heads of 2 features
  CHECK(declared.heads.head_dim == 2);
}

TEST_CASE("experts placed over 1, 2 and 4 ep ranks equal the unsharded block on every rank's tokens, thread mesh") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto& world) { expert_parallel_cases::check_expert_parallel(world); });
  }
}
