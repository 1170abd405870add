// A parallel style written in the test, not in the library (cases/custom_style_cases.hpp), on the thread mesh at
// 1, 2 and 4 ranks; test_mpi_custom_style.cpp runs the same cases under mpiexec. And a norm style and a module
// style of the test's own.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>
#include <type_traits>

#include "cases/custom_style_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("a style written outside the library trains like the unsharded block, its cost recorded, threads") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: ", n);
    worlds::run_threads(n, [](auto& world) { custom_style_cases::trains_like_the_unsharded_block(world); });
  }
}

TEST_CASE("LoRA adapters on a style written outside the library train like the unsharded block's, threads") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: ", n);
    worlds::run_threads(n, [](auto& world) { custom_style_cases::adapters_train_like_the_unsharded_block(world); });
  }
}

TEST_CASE("a module style written outside the library moves the module's input at its boundary, threads") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: ", n);
    worlds::run_threads(n, [](auto& world) { custom_style_cases::module_style_at_a_boundary(world); });
  }
}

TEST_CASE("a style written outside the library round-trips a sharded checkpoint, threads") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: ", n);
    auto const dir = std::filesystem::current_path() / ("custom_style_threads_" + std::to_string(n));
    std::filesystem::remove_all(dir);
    worlds::run_threads(n, [&](auto& world) { custom_style_cases::checkpoint_round_trip(world, dir); });
  }
}

// A norm style written here: a norm takes any style that says the layout its activations stay in (sw::norm_style).
namespace user_norm {
namespace sw = shardwise;
struct TokensApart {  // each rank normalizes its own tokens, as SequenceParallel does
  using input_layouts = sw::Shard<0>;
  using output_layouts = sw::Shard<0>;
};
using Plan = sw::plan<sw::at<"mine", TokensApart>, sw::at<"library", sw::SequenceParallel<>>>;
static_assert(sw::norm_style<TokensApart> && sw::norm_style<sw::SequenceParallel<>>);
static_assert(!sw::norm_style<sw::ColwiseParallel<>> &&
              !sw::norm_style<sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>);
}  // namespace user_norm

TEST_CASE("a norm style written outside the library: its norm keeps tokens apart, with partial weight gradients") {
  namespace sw = shardwise;
  using Matrix = sw::nn::matrix<double>;
  using Mine = sw::RMSNorm<double, sw::layer_at<user_norm::Plan, "mine">>;
  static_assert(std::is_same_v<Mine::layout, sw::Shard<0>>);
  static_assert(std::is_same_v<Mine::grad_placement, sw::Partial<sw::Sum>>);
  double const eps = 1e-6;
  Mine mine(6, eps);
  sw::RMSNorm<double, sw::layer_at<user_norm::Plan, "library">> library(6, eps);
  Matrix const x = Matrix::Random(5, 6), dy = Matrix::Random(5, 6);
  Eigen::VectorXd const w = Eigen::VectorXd::Random(6);
  mine.weight = w, library.weight = w;
  auto const y = mine(sw::Activation<double, sw::Shard<0>>{x});
  auto const dx = mine.backward(sw::Activation<double, sw::Shard<0>>{dy});
  auto const y_library = library(sw::Activation<double, sw::Shard<0>>{x});
  auto const dx_library = library.backward(sw::Activation<double, sw::Shard<0>>{dy});
  // The reference, written out: y = x / rms(x) * w; the weight's gradient sums dy * x / rms(x) over the tokens.
  Eigen::VectorXd const rstd = ((x.array().square().rowwise().mean() + eps).rsqrt()).matrix();
  Matrix const normalized = x.array().colwise() * rstd.array();
  Matrix const expected = normalized.array().rowwise() * w.transpose().array();
  Eigen::VectorXd const expected_dw = (dy.array() * normalized.array()).colwise().sum().transpose();
  CHECK((y.local - expected).cwiseAbs().maxCoeff() < 1e-12);
  CHECK((y.local - y_library.local).cwiseAbs().maxCoeff() == 0);
  CHECK((dx.local - dx_library.local).cwiseAbs().maxCoeff() == 0);
  auto const [weight] = mine.parameters();  // partial until reduced: the gradient waits beside the finished one
  CHECK(weight.reduced_into == &mine.weight_grad);
  CHECK((*weight.grad - expected_dw).cwiseAbs().maxCoeff() < 1e-12);
  CHECK(mine.weight_grad.cwiseAbs().maxCoeff() == 0);
}
