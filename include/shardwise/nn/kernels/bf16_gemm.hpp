#pragma once
// C (+)= A B with A and B in bf16 and C, the products' sums, in fp32: the products of sw::bf16_autocast. With
// oneDNN (the program links shardwise::onednn, which defines SHARDWISE_WITH_ONEDNN) they run on the CPU's bf16
// units (AMX tiles, or avx512_bf16 dot products); without it, as fp32 GEMMs of the widened operands: the same
// numbers up to the order of the sums, since a product of two bf16 values is exact in fp32. Where oneDNN has no bf16
// kernel for the CPU, the products take that path too, with a message once.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <vector>

#include "shardwise/nn/kernels/bf16.hpp"
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

#if defined(SHARDWISE_WITH_ONEDNN)
#include <dnnl.hpp>
#endif

namespace shardwise::detail {

/// A [rows, cols] matrix of bf16 values, element (i, j) at data[i * row_stride + j * col_stride]: a row-major
/// matrix, or the transpose of one (row_stride 1).
struct bf16_view {
  std::uint16_t const* data;
  Eigen::Index rows, cols, row_stride, col_stride;
  /// The transpose: [cols, rows], no copy.
  [[nodiscard]] bf16_view transposed() const { return {data, cols, rows, col_stride, row_stride}; }
};

/// A row-major matrix of bf16 values that owns them.
struct bf16_rows {
  std::vector<std::uint16_t> values;
  Eigen::Index rows = 0, cols = 0;
  [[nodiscard]] bf16_view view() const { return {values.data(), rows, cols, cols, 1}; }
};

/// `m` rounded to bf16 (to nearest even) into `out`, row-major. `out` keeps what it holds beyond: a buffer
/// rounded into every step is allocated (and its pages touched) once.
inline void round_into(bf16_rows& out, nn::const_matrix_ref<float> m) {
  if (out.values.size() < static_cast<std::size_t>(m.size())) out.values.resize(static_cast<std::size_t>(m.size()));
  out.rows = m.rows(), out.cols = m.cols();
  std::uint16_t* to = out.values.data();
  for (Eigen::Index r = 0; r < m.rows(); ++r) {
    float const* from = m.data() + r * m.outerStride();
    for (Eigen::Index c = 0; c < m.cols(); ++c) to[r * m.cols() + c] = to_bf16(from[c]);
  }
}

/// `m` rounded to bf16 (to nearest even), row-major.
[[nodiscard]] inline bf16_rows round_to_bf16(nn::const_matrix_ref<float> m) {
  bf16_rows out;
  round_into(out, m);
  return out;
}

/// The two buffers a model's Linears round their operands into under sw::bf16_autocast, owned by the scope and
/// shared by every Linear it sets: a product rounds into them and is done with them when it returns.
struct bf16_scratch {
  bf16_rows operand[2];
};

#if defined(SHARDWISE_WITH_ONEDNN)
/// The CPU engine every product runs on (oneDNN's engines are thread-safe; one is enough).
inline dnnl::engine const& onednn_engine() {
  static dnnl::engine const engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// Says once, on standard error, that oneDNN refused a bf16 product (a CPU it has no bf16 kernel for), which then
/// runs as an fp32 GEMM of the rounded operands: the same numbers, at fp32's speed or below.
inline void say_onednn_refused(char const* why) {
  static std::once_flag once;
  std::call_once(once, [why] {
    std::fprintf(stderr,
                 "shardwise: oneDNN has no bf16 matmul here (%s); bf16 products run as fp32 GEMMs of the rounded "
                 "operands (the same numbers, slower)\n",
                 why);
  });
}

/// c = a b (+= with `accumulate`) through oneDNN; false where oneDNN refuses the product.
inline bool onednn_gemm(bf16_view a, bf16_view b, float* c, Eigen::Index c_stride, bool accumulate) {
  using memory = dnnl::memory;
  try {
    memory::desc const a_md({a.rows, a.cols}, memory::data_type::bf16, {a.row_stride, a.col_stride});
    memory::desc const b_md({b.rows, b.cols}, memory::data_type::bf16, {b.row_stride, b.col_stride});
    memory::desc const c_md({a.rows, b.cols}, memory::data_type::f32, {c_stride, 1});
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops sum;
      sum.append_sum(1.0f);
      attr.set_post_ops(sum);
    }
    // oneDNN caches the primitive of each shape: after the first step, making one is a lookup.
    dnnl::matmul::primitive_desc const pd(dnnl::matmul::desc(a_md, b_md, c_md), attr, onednn_engine());
    dnnl::stream stream(onednn_engine());
    memory a_mem(a_md, onednn_engine(), const_cast<std::uint16_t*>(a.data));
    memory b_mem(b_md, onednn_engine(), const_cast<std::uint16_t*>(b.data));
    memory c_mem(c_md, onednn_engine(), c);
    dnnl::matmul(pd).execute(stream, {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, c_mem}});
    stream.wait();
    return true;
  } catch (dnnl::error const& e) {
    say_onednn_refused(e.what());
    return false;
  }
}
#endif

/// c [a.rows, b.cols] (row-major, rows `c_stride` apart) = a b, or += a b when `accumulate`.
inline void bf16_gemm(bf16_view a, bf16_view b, float* c, Eigen::Index c_stride, bool accumulate) {
  if (a.cols != b.rows)
    fail("shardwise::bf16_gemm: a is ", a.rows, "x", a.cols, " and b ", b.rows, "x", b.cols,
         "; a's columns must be b's rows");
  if (a.rows == 0 || b.cols == 0) return;
#if defined(SHARDWISE_WITH_ONEDNN)
  if (a.cols > 0 && onednn_gemm(a, b, c, c_stride, accumulate)) return;
#endif
  auto const widened = [](bf16_view v) {
    nn::matrix<float> m(v.rows, v.cols);
    for (Eigen::Index i = 0; i < v.rows; ++i)
      for (Eigen::Index j = 0; j < v.cols; ++j) m(i, j) = from_bf16(v.data[i * v.row_stride + j * v.col_stride]);
    return m;
  };
  // Through the library's fp32 kernels, not a product written here: this function is not a template, so a product
  // written here would be compiled in every file that includes it (SHARDWISE_SEPARATE_KERNELS compiles those once).
  Eigen::Map<nn::matrix<float>, 0, Eigen::OuterStride<>> out(c, a.rows, b.cols, Eigen::OuterStride<>(c_stride));
  if (accumulate)
    nn::linear_backward_weight<float>(widened(b), widened(a.transposed()), out, std::nullopt);  // out += a b
  else
    nn::linear_backward_input<float>(widened(b), widened(a), out);  // out = a b
}

}  // namespace shardwise::detail
