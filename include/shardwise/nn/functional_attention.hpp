#pragma once
// Causal grouped-query attention over a batch of whole sequences, forward and backward, as plain kernels on
// row-major [tokens, heads * head_dim] matrices: what a user's attention module (examples/blocks.hpp) and the
// Llama model share. Each sequence attends to itself only; query head h reads key-value head h / group.
#include <Eigen/Core>
#include <cmath>
#include <concepts>
#include <cstddef>
#include <limits>
#include <vector>

#include "shardwise/nn/functional_types.hpp"

namespace shardwise::nn {

/// What the backward of causal_attention needs besides q, k and v: the softmax probabilities of every
/// sequence and query head ([sequence, sequence] each), and the sizes.
template <class T>
struct attention_saved {
  std::vector<matrix<T>> probabilities;  ///< One [sequence, sequence] matrix per sequence and query head.
  /// The sizes causal_attention was called with.
  /// @{
  Eigen::Index sequence = 0, head_dim = 0, heads = 0, kv_heads = 0;
  /// @}
};

/// out = softmax(q k^T / sqrt(head_dim), causal) v for each sequence of `sequence` rows and each query head.
/// q, out [tokens, heads * head_dim]; k, v [tokens, kv_heads * head_dim]; heads a multiple of kv_heads; tokens
/// a multiple of sequence (rows of whole sequences). Fills `saved` for causal_attention_backward.
template <std::floating_point T>
void causal_attention(const_matrix_ref<T> q, const_matrix_ref<T> k, const_matrix_ref<T> v, std::size_t sequence,
                      std::size_t head_dim, matrix_ref<T> out, attention_saved<T>& saved) {
  constexpr char const* fn = "causal_attention";
  auto const s = static_cast<Eigen::Index>(sequence), d = static_cast<Eigen::Index>(head_dim);
  if (s == 0 || q.rows() % s != 0)
    detail::fail("shardwise::nn::", fn, ": ", q.rows(), " tokens are not whole sequences of ", sequence,
                 "; give it rows of whole sequences");
  if (d == 0 || q.cols() % d != 0 || k.cols() % d != 0 || k.cols() == 0 || (q.cols() / d) % (k.cols() / d) != 0)
    detail::fail("shardwise::nn::", fn, ": ", q.cols(), " query and ", k.cols(), " key columns are not whole heads of ",
                 head_dim, " with a whole number of query heads per key-value head");
  detail::nn_check_shape(fn, "k [tokens, kv_heads * head_dim]", k, q.rows(), k.cols());
  detail::nn_check_shape(fn, "v [tokens, kv_heads * head_dim]", v, q.rows(), k.cols());
  detail::nn_check_shape(fn, "out [tokens, heads * head_dim]", out, q.rows(), q.cols());
  saved = {{}, s, d, q.cols() / d, k.cols() / d};
  Eigen::Index const group = saved.heads / saved.kv_heads, sequences = q.rows() / s;
  T const scale = T(1) / std::sqrt(static_cast<T>(d));
  saved.probabilities.resize(static_cast<std::size_t>(sequences * saved.heads));
  for (Eigen::Index b = 0; b < sequences; ++b)
    for (Eigen::Index h = 0; h < saved.heads; ++h) {
      auto& p = saved.probabilities[static_cast<std::size_t>(b * saved.heads + h)];
      p.noalias() = q.block(b * s, h * d, s, d) * k.block(b * s, (h / group) * d, s, d).transpose() * scale;
      for (Eigen::Index i = 0; i < s; ++i) {
        p.row(i).tail(s - i - 1).setConstant(-std::numeric_limits<T>::infinity());
        p.row(i) = (p.row(i).array() - p.row(i).maxCoeff()).exp().matrix();
        p.row(i) /= p.row(i).sum();
      }
      out.block(b * s, h * d, s, d).noalias() = p * v.block(b * s, (h / group) * d, s, d);
    }
}

/// Backward of causal_attention, given dout: dq (assigned), dk and dv (assigned; a key-value head's gradient
/// sums over the query heads that read it).
template <std::floating_point T>
void causal_attention_backward(const_matrix_ref<T> dout, const_matrix_ref<T> q, const_matrix_ref<T> k,
                               const_matrix_ref<T> v, attention_saved<T> const& saved, matrix_ref<T> dq,
                               matrix_ref<T> dk, matrix_ref<T> dv) {
  constexpr char const* fn = "causal_attention_backward";
  Eigen::Index const s = saved.sequence, d = saved.head_dim, group = saved.heads / saved.kv_heads;
  detail::nn_check_shape(fn, "dout [tokens, heads * head_dim]", dout, q.rows(), saved.heads * d);
  detail::nn_check_shape(fn, "dq [tokens, heads * head_dim]", dq, q.rows(), saved.heads * d);
  detail::nn_check_shape(fn, "dk [tokens, kv_heads * head_dim]", dk, q.rows(), saved.kv_heads * d);
  detail::nn_check_shape(fn, "dv [tokens, kv_heads * head_dim]", dv, q.rows(), saved.kv_heads * d);
  T const scale = T(1) / std::sqrt(static_cast<T>(d));
  dk.setZero(), dv.setZero();
  for (Eigen::Index b = 0; b < q.rows() / s; ++b)
    for (Eigen::Index h = 0; h < saved.heads; ++h) {
      auto const& p = saved.probabilities[static_cast<std::size_t>(b * saved.heads + h)];
      auto const dO = dout.block(b * s, h * d, s, d);
      Eigen::Index const kv = (h / group) * d;
      matrix<T> ds = p.cwiseProduct(dO * v.block(b * s, kv, s, d).transpose());
      ds -= p.cwiseProduct(ds.rowwise().sum().replicate(1, s));
      dv.block(b * s, kv, s, d).noalias() += p.transpose() * dO;
      dq.block(b * s, h * d, s, d).noalias() = ds * k.block(b * s, kv, s, d) * scale;
      dk.block(b * s, kv, s, d).noalias() += ds.transpose() * q.block(b * s, h * d, s, d) * scale;
    }
}

}  // namespace shardwise::nn
