// The few-row product (nn/kernels/few_rows.hpp) through nn::linear_forward: 2 to 16 rows of x against weights of
// 256 and 263 rows (every remainder of the weight rows a pass takes at once), in float and double, with and without a
// bias, on slices of wider matrices, against sums in long double written here. The product with a bf16 weight
// (nn/kernels/bf16_weights.hpp) the same way at 1 to 20 rows, against the weight rounded by Eigen::bfloat16, and its
// rounding against Eigen's. The bf16 GEMM (nn/kernels/bf16_gemm.hpp) in the three layouts of a Linear's step, against
// long-double sums of the rounded operands. Built twice (tests/CMakeLists.txt): for AVX2 and for the build machine,
// so that each vector width the kernel has runs; the second with oneDNN where it is installed, the first without.
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <shardwise/nn/kernels/bf16_gemm.hpp>
#include <shardwise/nn/kernels/bf16_weights.hpp>
#include <shardwise/nn/kernels/functional.hpp>
#include <utility>
#include <vector>

namespace nn = shardwise::nn;
using Eigen::Index;

namespace {

template <class T>
nn::matrix<T> random_matrix(Index rows, Index cols, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  nn::matrix<T> m(rows, cols);
  for (Index k = 0; k < m.size(); ++k) m.data()[k] = static_cast<T>(dist(gen));
  return m;
}

/// The worst error of y (+ bias) against long-double sums, over the scale of each sum (sum of |x| |w|).
template <class T>
double worst_error(nn::matrix<T> const& x, nn::matrix<T> const& w, nn::vector<T> const* bias, nn::matrix<T> const& y) {
  double worst = 0;
  for (Index r = 0; r < x.rows(); ++r)
    for (Index o = 0; o < w.rows(); ++o) {
      long double sum = bias ? (*bias)(o) : 0, scale = bias ? std::abs((*bias)(o)) : 0;
      for (Index k = 0; k < x.cols(); ++k) {
        sum += static_cast<long double>(x(r, k)) * w(o, k);
        scale += std::abs(static_cast<long double>(x(r, k)) * w(o, k));
      }
      worst = std::max(worst, static_cast<double>(std::abs(y(r, o) - sum) / scale));
    }
  return worst;
}

/// Each sum within the bound of a sum of `in` products in T (in x epsilon of the sum's scale).
template <class T>
void check_few_rows() {
  int cases = 0;
  for (Index rows = 2; rows <= 16; ++rows)
    for (Index outs : {256, 263})
      for (Index in : {1, 7, 16, 37}) {
        double const tolerance = static_cast<double>(in + 1) * std::numeric_limits<T>::epsilon();
        nn::matrix<T> const w = random_matrix<T>(outs, in, static_cast<unsigned>(rows * 7 + in));
        nn::matrix<T> const wide_x = random_matrix<T>(rows, in + 3, static_cast<unsigned>(rows + outs));
        nn::matrix<T> const x = wide_x.middleCols(2, in);
        nn::vector<T> const bias = random_matrix<T>(outs, 1, 5).col(0);
        nn::matrix<T> y(rows, outs);
        nn::linear_forward<T>(wide_x.middleCols(2, in), w, std::nullopt, y);  // x read through a slice
        CHECK_MESSAGE(worst_error<T>(x, w, nullptr, y) < tolerance, rows, " rows, ", outs, " x ", in);
        // Into a slice of a wider output, with a bias: the columns around it untouched.
        nn::matrix<T> wide_y = nn::matrix<T>::Constant(rows, outs + 2, T(7));
        nn::linear_forward<T>(x, w, bias, wide_y.middleCols(1, outs));
        nn::matrix<T> const with_bias = wide_y.middleCols(1, outs);
        CHECK_MESSAGE(worst_error<T>(x, w, &bias, with_bias) < tolerance, rows, " rows, ", outs, " x ", in);
        CHECK(((wide_y.col(0).array() == T(7)).all() && (wide_y.col(outs + 1).array() == T(7)).all()));
        ++cases;
      }
  CHECK(cases == 15 * 2 * 4);
}

}  // namespace

TEST_CASE("few-row product: built for this target, equal to long-double sums in float and double") {
  // Built without the vectors, linear_forward would take its GEMM and these cases would prove nothing here.
  REQUIRE(shardwise::detail::few_rows_supported);
  MESSAGE("vector bytes ", shardwise::detail::few_rows_vector_bytes);
  check_few_rows<float>();
  check_few_rows<double>();
}

TEST_CASE(
    "bf16 weights: rounded as Eigen::bfloat16 rounds; the product equals long-double sums of x and the rounded "
    "weight at 1 to 20 rows") {
  namespace detail = shardwise::detail;
  // Rounding: ties to even, both signs, subnormals, the largest finite values (to infinity), infinities and NaN.
  std::vector<float> values{0.0f,
                            -0.0f,
                            1.0f,
                            1.00390625f,
                            1.005859375f,
                            1.0078125f,
                            -3.14159f,
                            1e-40f,
                            -1e-42f,
                            3.4e38f,
                            std::numeric_limits<float>::max(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity()};
  nn::matrix<float> const many = random_matrix<float>(1, 4096, 3) * 1e3f;
  values.insert(values.end(), many.data(), many.data() + many.size());
  for (float v : values) {
    INFO("value " << v);
    CHECK(detail::to_bf16(v) == std::bit_cast<std::uint16_t>(Eigen::bfloat16(v)));
    CHECK(detail::from_bf16(detail::to_bf16(v)) == static_cast<float>(Eigen::bfloat16(v)));
  }
  CHECK(std::isnan(detail::from_bf16(detail::to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  int cases = 0;
  for (Index rows = 1; rows <= 20; ++rows)
    for (Index outs : {256, 263})
      for (Index in : {7, 37}) {
        double const tolerance = static_cast<double>(in + 1) * std::numeric_limits<float>::epsilon();
        nn::matrix<float> const w = random_matrix<float>(outs, in, static_cast<unsigned>(rows * 5 + in));
        nn::matrix<float> const rounded = w.cast<Eigen::bfloat16>().cast<float>();
        nn::matrix<float> const x = random_matrix<float>(rows, in, static_cast<unsigned>(rows + outs));
        nn::vector<float> const bias = random_matrix<float>(outs, 1, 9).col(0);
        auto const w16 = detail::to_bf16(w);
        nn::matrix<float> wide_y = nn::matrix<float>::Constant(rows, outs + 2, 7.0f);
        detail::bf16_weight_product(x, w16, bias, wide_y.middleCols(1, outs));
        nn::matrix<float> const y = wide_y.middleCols(1, outs);
        CHECK_MESSAGE(worst_error<float>(x, rounded, &bias, y) < tolerance, rows, " rows, ", outs, " x ", in);
        CHECK(((wide_y.col(0).array() == 7.0f).all() && (wide_y.col(outs + 1).array() == 7.0f).all()));
        nn::matrix<float> plain(rows, outs);
        detail::bf16_weight_product(x, w16, std::nullopt, plain);
        CHECK_MESSAGE(worst_error<float>(x, rounded, nullptr, plain) < tolerance, rows, " rows, ", outs, " x ", in);
        CHECK((rounded - w).cwiseAbs().maxCoeff() > 0);  // the weight was rounded: the check above can tell
        ++cases;
      }
  CHECK(cases == 20 * 2 * 2);
}

TEST_CASE(
    "bf16 GEMM: a Linear's three products (y = x W^T, dx = dy W, dW += dy^T x) equal long-double sums of the "
    "operands rounded to bf16") {
  namespace detail = shardwise::detail;
#if defined(SHARDWISE_WITH_ONEDNN)
  MESSAGE("through oneDNN");
#else
  MESSAGE("as fp32 GEMMs of the widened operands");
#endif
  auto const rounded = [](nn::matrix<float> const& m) -> nn::matrix<float> {
    return m.cast<Eigen::bfloat16>().cast<float>();
  };
  // The worst error of c against a b (+ c0) in long double, over the scale of each sum (sum of |a| |b|, |c0|).
  auto const worst = [](nn::matrix<float> const& a, nn::matrix<float> const& b, nn::matrix<float> const& c0,
                        nn::matrix<float> const& c) {
    double w = 0;
    for (Index i = 0; i < a.rows(); ++i)
      for (Index j = 0; j < b.cols(); ++j) {
        long double sum = c0(i, j), scale = std::abs(c0(i, j));
        for (Index k = 0; k < a.cols(); ++k) {
          sum += static_cast<long double>(a(i, k)) * b(k, j);
          scale += std::abs(static_cast<long double>(a(i, k)) * b(k, j));
        }
        w = std::max(w, static_cast<double>(std::abs(c(i, j) - sum) / (scale + 1e-30L)));
      }
    return w;
  };
  for (Index tokens : {1, 5, 64})
    for (auto [in, out] : {std::pair<Index, Index>{7, 3}, {48, 33}, {130, 257}}) {
      INFO(tokens << " tokens, " << in << " -> " << out);
      double const tolerance = static_cast<double>(std::max(in, tokens) + 1) * std::numeric_limits<float>::epsilon();
      nn::matrix<float> const x = random_matrix<float>(tokens, in, 1), w = random_matrix<float>(out, in, 2);
      nn::matrix<float> const dy = random_matrix<float>(tokens, out, 3), dw0 = random_matrix<float>(out, in, 4);
      auto const x16 = detail::round_to_bf16(x), w16 = detail::round_to_bf16(w), dy16 = detail::round_to_bf16(dy);
      nn::matrix<float> y(tokens, out), dx(tokens, in), dw = dw0;
      detail::bf16_gemm(x16.view(), w16.view().transposed(), y.data(), y.outerStride(), false);
      detail::bf16_gemm(dy16.view(), w16.view(), dx.data(), dx.outerStride(), false);
      detail::bf16_gemm(dy16.view().transposed(), x16.view(), dw.data(), dw.outerStride(), true);
      nn::matrix<float> const zero_y = nn::matrix<float>::Zero(tokens, out),
                              zero_dx = nn::matrix<float>::Zero(tokens, in);
      CHECK(worst(rounded(x), rounded(w).transpose(), zero_y, y) < tolerance);
      CHECK(worst(rounded(dy), rounded(w), zero_dx, dx) < tolerance);
      CHECK(worst(rounded(dy).transpose(), rounded(x), dw0, dw) < tolerance);
      CHECK((rounded(x) - x).cwiseAbs().maxCoeff() > 0);  // the operands were rounded: the checks above can tell
    }
  // Into a slice of a wider output (rows 9 floats apart), the columns around it untouched.
  nn::matrix<float> const x = random_matrix<float>(4, 6, 5), w = random_matrix<float>(7, 6, 6);
  nn::matrix<float> wide = nn::matrix<float>::Constant(4, 9, 3.0f);
  auto const x16 = detail::round_to_bf16(x), w16 = detail::round_to_bf16(w);
  detail::bf16_gemm(x16.view(), w16.view().transposed(), wide.data() + 1, wide.outerStride(), false);
  nn::matrix<float> const inside = wide.middleCols(1, 7);
  CHECK(worst(rounded(x), rounded(w).transpose(), nn::matrix<float>::Zero(4, 7), inside) < 7 * 1.2e-7);
  CHECK(((wide.col(0).array() == 3.0f).all() && (wide.col(8).array() == 3.0f).all()));
  CHECK_THROWS_WITH(detail::bf16_gemm(x16.view(), w16.view(), wide.data(), 9, false),
                    doctest::Contains("a is 4x6 and b 7x6; a's columns must be b's rows"));
}
