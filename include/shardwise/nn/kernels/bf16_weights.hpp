#pragma once
// y = x W^T with W held in bf16 (each fp32 weight rounded to its upper 16 bits, to nearest even) and x, the products
// and the sums in fp32: a decode step reads half the bytes of an fp32 weight. A bf16 value widened to fp32 is exact,
// so the result is the fp32 product with the rounded weight, up to the order of the sums. A few rows of x (1 to 16:
// decoding) go through the few-row kernels (nn/kernels/few_rows.hpp), which widen the weights in registers as they
// stream in; more rows (a prefill), or a target without AVX, widen a block of weight rows at a time for the GEMM.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "shardwise/nn/kernels/bf16.hpp"
#include "shardwise/nn/kernels/few_rows.hpp"
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::detail {

/// A row-major matrix of bf16 values.
struct bf16_matrix {
  std::vector<std::uint16_t> values;
  Eigen::Index rows = 0, cols = 0;
  [[nodiscard]] std::size_t bytes() const { return values.size() * sizeof(std::uint16_t); }
};

/// `m` rounded to bf16.
[[nodiscard]] inline bf16_matrix to_bf16(nn::const_matrix_ref<float> m) {
  bf16_matrix out{std::vector<std::uint16_t>(static_cast<std::size_t>(m.size())), m.rows(), m.cols()};
  for (Eigen::Index r = 0; r < m.rows(); ++r)
    for (Eigen::Index c = 0; c < m.cols(); ++c)
      out.values[static_cast<std::size_t>(r * m.cols() + c)] = to_bf16(m(r, c));
  return out;
}

/// `count` rows of bf16 values, each `stride` apart, widened into `out` ([count, in], contiguous).
inline void widen_bf16_rows(std::uint16_t const* w, std::ptrdiff_t stride, int count, std::ptrdiff_t in, float* out) {
  for (int o = 0; o < count; ++o)
    for (std::ptrdiff_t k = 0; k < in; ++k) out[o * in + k] = from_bf16(w[o * stride + k]);
}

/// y = x W^T (+ bias) with W in bf16: x [N, in], w [out, in], bias [out] or std::nullopt, y [N, out].
inline void bf16_weight_product(nn::const_matrix_ref<float> x, bf16_matrix const& w,
                                std::optional<nn::const_vector_ref<float>> bias, nn::matrix_ref<float> y) {
  constexpr char const* fn = "bf16_weight_product";
  nn_check_shape(fn, "weight [out, in]", w.rows, w.cols, w.rows, x.cols());
  nn_check_shape(fn, "y [N, out]", y, x.rows(), w.rows);
  if (bias) nn_check_size(fn, "bias [out]", *bias, w.rows);
#if defined(__AVX__)  // few_rows_supported
  if (x.rows() >= 1 && x.rows() <= few_rows_most) {
    if (bias) y.rowwise() = bias->transpose();
    few_rows_product<float>(x.data(), x.outerStride(), static_cast<int>(x.rows()), w.values.data(), w.cols, w.rows,
                            w.cols, y.data(), y.outerStride(), bias.has_value());
    return;
  }
#endif
  // Each block through the library's fp32 kernel, not a product written here: this function is not a template, so a
  // product written here would be compiled in every file that includes it.
  constexpr Eigen::Index block = 128;  // weight rows widened at once: 128 x in floats, in the cache for the GEMM
  std::vector<float> buffer;
  for (Eigen::Index first = 0; first < w.rows; first += block) {
    Eigen::Index const n = std::min(block, w.rows - first);
    buffer.resize(static_cast<std::size_t>(n * w.cols));
    widen_bf16_rows(w.values.data() + first * w.cols, w.cols, static_cast<int>(n), w.cols, buffer.data());
    Eigen::Map<nn::matrix<float> const> const wide(buffer.data(), n, w.cols);
    std::optional<nn::const_vector_ref<float>> block_bias;
    if (bias) block_bias.emplace(bias->segment(first, n));
    nn::linear_forward<float>(x, wide, block_bias, y.middleCols(first, n));
  }
}

}  // namespace shardwise::detail
