#pragma once
// The attention shardwise had before it was blocked, kept as the reference the blocked one must equal: every
// sequence's and head's whole [sequence, sequence] probability matrix, computed, kept and used by the backward.
// The tests compare against it; bench/attention.cpp measures against it.
#include <Eigen/Core>
#include <cmath>
#include <cstddef>
#include <limits>
#include <vector>

namespace ref {

template <class T>
using attention_matrix = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

template <class T>
struct materialized_attention {
  std::vector<attention_matrix<T>> probabilities;  // one [sequence, sequence] per sequence and query head
  Eigen::Index sequence = 0, head_dim = 0, heads = 0, kv_heads = 0;

  void forward(attention_matrix<T> const& q, attention_matrix<T> const& k, attention_matrix<T> const& v, Eigen::Index s,
               Eigen::Index d, attention_matrix<T>& out) {
    sequence = s, head_dim = d, heads = q.cols() / d, kv_heads = k.cols() / d;
    Eigen::Index const group = heads / kv_heads, sequences = q.rows() / s;
    T const scale = T(1) / std::sqrt(static_cast<T>(d));
    probabilities.assign(static_cast<std::size_t>(sequences * heads), {});
    out.resize(q.rows(), q.cols());
    for (Eigen::Index b = 0; b < sequences; ++b)
      for (Eigen::Index h = 0; h < heads; ++h) {
        auto& p = probabilities[static_cast<std::size_t>(b * heads + h)];
        p.noalias() = q.block(b * s, h * d, s, d) * k.block(b * s, (h / group) * d, s, d).transpose() * scale;
        for (Eigen::Index i = 0; i < s; ++i) {
          p.row(i).tail(s - i - 1).setConstant(-std::numeric_limits<T>::infinity());
          p.row(i) = (p.row(i).array() - p.row(i).maxCoeff()).exp().matrix();
          p.row(i) /= p.row(i).sum();
        }
        out.block(b * s, h * d, s, d).noalias() = p * v.block(b * s, (h / group) * d, s, d);
      }
  }

  void backward(attention_matrix<T> const& dout, attention_matrix<T> const& q, attention_matrix<T> const& k,
                attention_matrix<T> const& v, attention_matrix<T>& dq, attention_matrix<T>& dk,
                attention_matrix<T>& dv) const {
    Eigen::Index const s = sequence, d = head_dim, group = heads / kv_heads;
    T const scale = T(1) / std::sqrt(static_cast<T>(d));
    dq.resize(q.rows(), q.cols()), dk.setZero(k.rows(), k.cols()), dv.setZero(v.rows(), v.cols());
    for (Eigen::Index b = 0; b < q.rows() / s; ++b)
      for (Eigen::Index h = 0; h < heads; ++h) {
        auto const& p = probabilities[static_cast<std::size_t>(b * heads + h)];
        auto const dO = dout.block(b * s, h * d, s, d);
        Eigen::Index const kv = (h / group) * d;
        attention_matrix<T> ds = p.cwiseProduct(dO * v.block(b * s, kv, s, d).transpose());
        ds -= p.cwiseProduct(ds.rowwise().sum().replicate(1, s));
        dv.block(b * s, kv, s, d).noalias() += p.transpose() * dO;
        dq.block(b * s, h * d, s, d).noalias() = ds * k.block(b * s, kv, s, d) * scale;
        dk.block(b * s, kv, s, d).noalias() += ds.transpose() * q.block(b * s, h * d, s, d) * scale;
      }
  }
};

}  // namespace ref
