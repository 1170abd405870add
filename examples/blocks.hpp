#pragma once
// Two transformer blocks written the way a user writes them against shardwise: the layers come from the
// plan by name, forward and backward are plain code. Used by the examples and by the tests, which compare
// every sharded run with the same block built with sw::serial_plan.
#include <cmath>
#include <cstdint>
#include <shardwise/nn.hpp>

namespace blocks {

namespace sw = shardwise;

/// SwiGLU feed-forward, as in Llama: w2(silu(w1(x)) * w3(x)).
template <class T, class Plan = sw::serial_plan>
struct FeedForward {
  sw::Prepare<T, sw::own_style<Plan>> prepare;  // PrepareModuleInput on "feed_forward" under sequence parallelism
  sw::Linear<T, sw::style_at<Plan, "w1">> w1;
  sw::Linear<T, sw::style_at<Plan, "w3">> w3;
  sw::Linear<T, sw::style_at<Plan, "w2">> w2;
  SHARDWISE_CHILDREN(prepare, w1, w3, w2)

  FeedForward(std::size_t dim, std::size_t hidden, std::uint64_t seed)
      : w1(dim, hidden, seed + 1, false), w3(dim, hidden, seed + 2, false), w2(hidden, dim, seed + 3, false) {}

  template <class X>
  auto forward(X const& x) {
    auto in = prepare.input(x);
    h1_ = w1(in);
    h3_ = w3(in);
    a_ = sw::silu(h1_);
    return prepare.output(w2(a_ * h3_));
  }

  template <class DY>
  auto backward(DY const& dy) {
    auto dp = w2.backward(prepare.output_backward(dy));
    auto dh1 = sw::silu_backward(h1_, dp * h3_);
    auto dh3 = dp * a_;
    return prepare.input_backward(w1.backward(dh1) + w3.backward(dh3));
  }

 private:
  decltype(std::declval<sw::Linear<T, sw::style_at<Plan, "w1">>&>()(std::declval<sw::nn::matrix<T>>())) h1_, h3_, a_;
};

/// Multi-head self-attention with a causal mask; q, k, v and the output projection are Linear layers, and
/// under ColwiseParallel on wq/wk/wv each rank holds whole heads (heads / tp of them). StaticHeads (optional):
/// the head count known at compile time, so a static tp size that does not divide it does not compile.
template <class T, class Plan = sw::serial_plan, std::size_t StaticHeads = sw::dynamic_size>
struct Attention {
  sw::Prepare<T, sw::own_style<Plan>> prepare;
  sw::Linear<T, sw::style_at<Plan, "wq">> wq;
  sw::Linear<T, sw::style_at<Plan, "wk">> wk;
  sw::Linear<T, sw::style_at<Plan, "wv">> wv;
  sw::Linear<T, sw::style_at<Plan, "wo">> wo;
  SHARDWISE_CHILDREN(prepare, wq, wk, wv, wo)

  Attention(std::size_t dim, std::size_t heads, std::uint64_t seed)
      : wq(dim, dim, seed + 1),
        wk(dim, dim, seed + 2),
        wv(dim, dim, seed + 3),
        wo(dim, dim, seed + 4),
        heads_(heads),
        head_dim_(dim / heads) {
    if (StaticHeads != sw::dynamic_size && heads != StaticHeads)
      sw::detail::fail("blocks::Attention: declared with ", StaticHeads, " heads but built with ", heads);
  }

  /// Called by sw::parallelize when the tp size is static.
  template <std::size_t Ranks>
  static constexpr bool shardwise_static_check() {
    constexpr bool ok = StaticHeads == sw::dynamic_size || StaticHeads % Ranks == 0;
    static_assert(ok,
                  "shardwise::ColwiseParallel on attention: the heads do not divide over the tp size; choose a "
                  "head count the tp size divides");
    constexpr bool named = sw::detail::static_divides<sw::own_style<Plan>::path, StaticHeads, Ranks>();
    return ok && named;
  }

  /// Called by sw::parallelize: heads must split whole over the group.
  void shardwise_on_parallelize(int tp_size) const {
    if (heads_ % static_cast<std::size_t>(tp_size) != 0)
      sw::detail::fail("shardwise::ColwiseParallel at \"", sw::own_style<Plan>::path.view(), "\": ", heads_,
                       " heads do not divide over ", tp_size, " ranks; choose a head count the tp size divides");
  }

  template <class X>
  auto forward(X const& x) {
    auto in = prepare.input(x);
    q_ = wq(in);
    k_ = wk(in);
    v_ = wv(in);
    using M = sw::nn::matrix<T>;
    Eigen::Index const s = q_.local.rows(), d = static_cast<Eigen::Index>(head_dim_);
    Eigen::Index const local_heads = q_.local.cols() / d;
    probabilities_.assign(static_cast<std::size_t>(local_heads), M());
    auto out = q_;  // same layout and shape: [tokens, local heads * head_dim]
    T const scale = T(1) / std::sqrt(static_cast<T>(head_dim_));
    for (Eigen::Index h = 0; h < local_heads; ++h) {
      M scores = q_.local.middleCols(h * d, d) * k_.local.middleCols(h * d, d).transpose() * scale;
      for (Eigen::Index i = 0; i < s; ++i) {
        for (Eigen::Index j = i + 1; j < s; ++j) scores(i, j) = -std::numeric_limits<T>::infinity();
        scores.row(i) = (scores.row(i).array() - scores.row(i).maxCoeff()).exp().matrix();
        scores.row(i) /= scores.row(i).sum();
      }
      out.local.middleCols(h * d, d) = scores * v_.local.middleCols(h * d, d);
      probabilities_[static_cast<std::size_t>(h)] = std::move(scores);
    }
    return prepare.output(wo(out));
  }

  template <class DY>
  auto backward(DY const& dy) {
    auto dout = wo.backward(prepare.output_backward(dy));
    using M = sw::nn::matrix<T>;
    Eigen::Index const d = static_cast<Eigen::Index>(head_dim_);
    auto dq = q_, dk = k_, dv = v_;
    T const scale = T(1) / std::sqrt(static_cast<T>(head_dim_));
    for (std::size_t h = 0; h < probabilities_.size(); ++h) {
      auto const c = static_cast<Eigen::Index>(h) * d;
      M const& p = probabilities_[h];
      M const dprob = dout.local.middleCols(c, d) * v_.local.middleCols(c, d).transpose();
      dv.local.middleCols(c, d) = p.transpose() * dout.local.middleCols(c, d);
      M dscores = p.cwiseProduct(dprob);
      dscores -= p.cwiseProduct((dscores.rowwise().sum()).replicate(1, p.cols()));
      dq.local.middleCols(c, d) = dscores * k_.local.middleCols(c, d) * scale;
      dk.local.middleCols(c, d) = dscores.transpose() * q_.local.middleCols(c, d) * scale;
    }
    return prepare.input_backward(wq.backward(dq) + wk.backward(dk) + wv.backward(dv));
  }

 private:
  using projection =
      decltype(std::declval<sw::Linear<T, sw::style_at<Plan, "wq">>&>()(std::declval<sw::nn::matrix<T>>()));
  std::size_t heads_, head_dim_;
  projection q_, k_, v_;
  std::vector<sw::nn::matrix<T>> probabilities_;
};

}  // namespace blocks
