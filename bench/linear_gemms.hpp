#pragma once
// A Linear's forward and backward GEMMs alone, as the benchmarks time the machine without the library around them:
// in the element type through Eigen (and OpenBLAS where linked), or in bf16 through oneDNN, which sw::bf16_autocast
// multiplies with, on operands already in bf16 (so that the library's rounding is not among them).
#include <shardwise/nn/kernels/functional_types.hpp>

#if defined(SHARDWISE_WITH_ONEDNN)
#include <cstdint>
#include <dnnl.hpp>
#include <unordered_map>
#include <vector>
#endif

namespace bench {

/// y = x w^T, dx = dy w, dw = dy^T x: 6 x tokens x in x out FLOPs, for x [tokens, in] and w [out, in].
template <class T>
void linear_gemms(shardwise::nn::matrix<T> const& x, shardwise::nn::matrix<T> const& w,
                  shardwise::nn::matrix<T> const& dy, shardwise::nn::matrix<T>& y, shardwise::nn::matrix<T>& dx,
                  shardwise::nn::matrix<T>& dw) {
  y.noalias() = x * w.transpose();
  dx.noalias() = dy * w;
  dw.noalias() = dy.transpose() * x;
}

#if defined(SHARDWISE_WITH_ONEDNN)
/// The same three products in bf16 with fp32 sums, through oneDNN (dw accumulated, as a Linear's gradient is).
class onednn_bf16_linear_gemms {
 public:
  onednn_bf16_linear_gemms(long tokens, long in, long out) {
    using md = dnnl::memory::desc;
    auto const bf16 = dnnl::memory::data_type::bf16, f32 = dnnl::memory::data_type::f32;
    auto const rows = dnnl::memory::format_tag::ab, transposed = dnnl::memory::format_tag::ba;
    dnnl::memory x = filled(md({tokens, in}, bf16, rows)), dy = filled(md({tokens, out}, bf16, rows));
    dnnl::memory w = filled(md({out, in}, bf16, rows));
    dnnl::memory w_t(md({in, out}, bf16, transposed), engine_, w.get_data_handle());
    dnnl::memory dy_t(md({out, tokens}, bf16, transposed), engine_, dy.get_data_handle());
    add(x, w_t, dnnl::memory(md({tokens, out}, f32, rows), engine_), false);  // y = x w^T
    add(dy, w, dnnl::memory(md({tokens, in}, f32, rows), engine_), false);    // dx = dy w
    add(dy_t, x, dnnl::memory(md({out, in}, f32, rows), engine_), true);      // dw += dy^T x
  }
  /// Runs the three once.
  void run() {
    for (std::size_t k = 0; k < products_.size(); ++k) products_[k].execute(stream_, arguments_[k]);
    stream_.wait();
  }

 private:
  dnnl::memory filled(dnnl::memory::desc const& desc) {
    dnnl::memory m(desc, engine_);
    auto* values = static_cast<std::uint16_t*>(m.get_data_handle());
    for (std::size_t i = 0; i < desc.get_size() / 2; ++i) values[i] = std::uint16_t(0x3c00 + i % 97);  // ~0.01
    return m;
  }
  void add(dnnl::memory const& a, dnnl::memory const& b, dnnl::memory const& c, bool accumulate) {
    dnnl::primitive_attr attr;
    if (accumulate) {
      dnnl::post_ops sum;
      sum.append_sum(1.0f);
      attr.set_post_ops(sum);
    }
    dnnl::matmul::desc const desc(a.get_desc(), b.get_desc(), c.get_desc());
    products_.emplace_back(dnnl::matmul::primitive_desc(desc, attr, engine_));
    arguments_.push_back({{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  }

  dnnl::engine engine_{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream_{engine_};
  std::vector<dnnl::matmul> products_;
  std::vector<std::unordered_map<int, dnnl::memory>> arguments_;
};
#endif

}  // namespace bench
