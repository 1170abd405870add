#pragma once
// A GPT-2-style decoder written against shardwise's public API only, as a user would write it: token
// embedding `wte` plus learned position embedding `wpe`; blocks of LayerNorm -> causal multi-head attention
// (q, k and v as three Linear layers with bias, so ColwiseParallel cuts whole heads) -> residual -> LayerNorm
// -> MLP (dim -> 4 dim, GELU with the tanh approximation, transformers' "gelu_new", -> dim) -> residual; final
// LayerNorm `ln_f`; the LM head tied to `wte`, as GPT-2 always is. Names follow transformers' GPT2LMHeadModel
// without its "transformer." prefix ("h.0.attn.c_proj.weight"), but for q/k/v, which GPT2LMHeadModel fuses
// into c_attn (Conv1D, [in, out]): here q_proj, k_proj and v_proj, each [out, in]. The plan decides how it is
// sharded (models/gpt2_plan.hpp); with sw::serial_plan it is the unsharded reference.
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <sstream>
#include <string>
#include <vector>

#include "shardwise/nn.hpp"

namespace shardwise::models {

struct GPT2Config {
  std::size_t vocabulary = 256;
  std::size_t dim = 64;
  std::size_t layers = 2;
  std::size_t heads = 4;
  std::size_t sequence = 32;  // tokens per sequence, and the positions wpe holds (transformers' n_positions)
  double layer_norm_eps = 1e-5;
  std::uint64_t seed = 1234;
  [[nodiscard]] std::size_t head_dim() const { return dim / heads; }
  [[nodiscard]] std::size_t hidden() const { return 4 * dim; }  // GPT-2's n_inner default
};

/// Throws shardwise::error with the parts written one after another (the public way to fail with a message).
template <class... Parts>
[[noreturn]] void gpt2_fail(Parts const&... parts) {
  std::ostringstream message;
  (message << ... << parts);
  throw error(message.str());
}

/// Causal multi-head self-attention with biases. Under ColwiseParallel on q_proj, k_proj and v_proj each rank
/// computes heads / tp whole heads; c_proj (RowwiseParallel) sums the heads' contributions.
template <class T, class Plan = serial_plan>
struct GPT2Attention {
  Prepare<T, own_style<Plan>> prepare;
  Linear<T, style_at<Plan, "q_proj">> q_proj;
  Linear<T, style_at<Plan, "k_proj">> k_proj;
  Linear<T, style_at<Plan, "v_proj">> v_proj;
  Linear<T, style_at<Plan, "c_proj">> c_proj;
  SHARDWISE_CHILDREN(prepare, q_proj, k_proj, v_proj, c_proj)

  GPT2Attention(GPT2Config const& c, std::uint64_t seed)
      : q_proj(c.dim, c.dim, seed + 1),
        k_proj(c.dim, c.dim, seed + 2),
        v_proj(c.dim, c.dim, seed + 3),
        c_proj(c.dim, c.dim, seed + 4),
        config_(c) {}

  /// Called by sw::parallelize before any layer is cut: each rank must hold whole heads.
  void shardwise_on_parallelize(int tp) {
    constexpr bool sharded_heads = is_colwise_v<typename decltype(q_proj)::style>;
    if (sharded_heads && config_.heads % static_cast<std::size_t>(tp) != 0)
      gpt2_fail("shardwise::models::GPT2 at \"", own_style<Plan>::path.view(), "\": ", config_.heads,
                " heads do not divide over ", tp,
                " ranks; each rank computes whole heads: choose a tp size that divides the heads");
  }

  template <class X>
  auto forward(X const& x) {
    auto in = prepare.input(x);
    q_ = q_proj(in), k_ = k_proj(in), v_ = v_proj(in);
    auto const d = static_cast<Eigen::Index>(config_.head_dim()), s = static_cast<Eigen::Index>(config_.sequence);
    Eigen::Index const heads = q_.local.cols() / d, sequences = q_.local.rows() / s;
    T const scale = T(1) / std::sqrt(static_cast<T>(d));
    auto out = q_;
    probabilities_.assign(static_cast<std::size_t>(sequences * heads), nn::matrix<T>());
    for (Eigen::Index b = 0; b < sequences; ++b)
      for (Eigen::Index h = 0; h < heads; ++h) {
        nn::matrix<T> p = q_.local.block(b * s, h * d, s, d) * k_.local.block(b * s, h * d, s, d).transpose() * scale;
        causal_softmax(p);
        out.local.block(b * s, h * d, s, d) = p * v_.local.block(b * s, h * d, s, d);
        probabilities_[static_cast<std::size_t>(b * heads + h)] = std::move(p);
      }
    return prepare.output(c_proj(out));
  }

  template <class DY>
  auto backward(DY const& dy) {
    auto dout = c_proj.backward(prepare.output_backward(dy));
    auto const d = static_cast<Eigen::Index>(config_.head_dim()), s = static_cast<Eigen::Index>(config_.sequence);
    Eigen::Index const heads = q_.local.cols() / d, sequences = q_.local.rows() / s;
    T const scale = T(1) / std::sqrt(static_cast<T>(d));
    auto dq = q_, dk = k_, dv = v_;
    for (Eigen::Index b = 0; b < sequences; ++b)
      for (Eigen::Index h = 0; h < heads; ++h) {
        auto const& p = probabilities_[static_cast<std::size_t>(b * heads + h)];
        auto const dO = dout.local.block(b * s, h * d, s, d);
        dv.local.block(b * s, h * d, s, d) = p.transpose() * dO;
        nn::matrix<T> ds = p.cwiseProduct(dO * v_.local.block(b * s, h * d, s, d).transpose());
        ds -= p.cwiseProduct(ds.rowwise().sum().replicate(1, p.cols()));  // the softmax's backward
        dq.local.block(b * s, h * d, s, d) = ds * k_.local.block(b * s, h * d, s, d) * scale;
        dk.local.block(b * s, h * d, s, d) = ds.transpose() * q_.local.block(b * s, h * d, s, d) * scale;
      }
    return prepare.input_backward(q_proj.backward(dq) + k_proj.backward(dk) + v_proj.backward(dv));
  }

 private:
  /// Row-wise softmax of the scores with every future position left out (-inf, so exactly zero weight).
  static void causal_softmax(nn::matrix<T>& p) {
    for (Eigen::Index i = 0; i < p.rows(); ++i) {
      for (Eigen::Index j = i + 1; j < p.cols(); ++j) p(i, j) = -std::numeric_limits<T>::infinity();
      p.row(i) = (p.row(i).array() - p.row(i).maxCoeff()).exp().matrix();
      p.row(i) /= p.row(i).sum();
    }
  }

  GPT2Config config_;
  output_t<decltype(q_proj)> q_, k_, v_;
  std::vector<nn::matrix<T>> probabilities_;  // [sequence, sequence] per (sequence, head), for backward
};

/// The feed-forward: c_fc (dim -> 4 dim), gelu_new, c_proj (4 dim -> dim), both with bias.
template <class T, class Plan = serial_plan>
struct GPT2MLP {
  Prepare<T, own_style<Plan>> prepare;
  Linear<T, style_at<Plan, "c_fc">> c_fc;
  Linear<T, style_at<Plan, "c_proj">> c_proj;
  SHARDWISE_CHILDREN(prepare, c_fc, c_proj)

  GPT2MLP(GPT2Config const& c, std::uint64_t seed)
      : c_fc(c.dim, c.hidden(), seed + 1), c_proj(c.hidden(), c.dim, seed + 2) {}

  template <class X>
  auto forward(X const& x) {
    h_ = c_fc(prepare.input(x));
    return prepare.output(c_proj(gelu_tanh(h_)));
  }
  template <class DY>
  auto backward(DY const& dy) {
    auto da = c_proj.backward(prepare.output_backward(dy));
    return prepare.input_backward(c_fc.backward(gelu_tanh_backward(h_, da)));
  }

 private:
  output_t<decltype(c_fc)> h_;  // before the activation: gelu_tanh_backward needs it
};

template <class T, class Plan = serial_plan>
struct GPT2Block {
  LayerNorm<T, style_at<Plan, "ln_1">> ln_1;
  GPT2Attention<T, subplan<Plan, "attn">> attn;
  LayerNorm<T, style_at<Plan, "ln_2">> ln_2;
  GPT2MLP<T, subplan<Plan, "mlp">> mlp;
  SHARDWISE_CHILDREN(ln_1, attn, ln_2, mlp)

  GPT2Block(GPT2Config const& c, std::uint64_t seed)
      : ln_1(c.dim, static_cast<T>(c.layer_norm_eps)),
        attn(c, seed),
        ln_2(c.dim, static_cast<T>(c.layer_norm_eps)),
        mlp(c, seed + 10) {}

  template <class X>
  auto forward(X const& x) {
    auto h = x + attn.forward(ln_1(x));
    return h + mlp.forward(ln_2(h));
  }
  template <class DY>
  auto backward(DY const& dy) {
    auto dh = dy + ln_2.backward(mlp.backward(dy));
    return dh + ln_1.backward(attn.backward(dh));
  }
};

/// The decoder. forward(ids) takes a batch of whole sequences of config.sequence tokens (positions restart at
/// 0 in each) and gives logits [tokens, vocabulary] (this rank's part, in the plan's layout); backward(dlogits)
/// accumulates every parameter's gradient. lm_head computes with wte's table: one tensor, walked, stepped and
/// saved once, as "wte.weight".
template <class T, class Plan = serial_plan>
struct GPT2 {
  Embedding<T, style_at<Plan, "wte">> wte;
  Embedding<T, style_at<Plan, "wpe">> wpe;
  std::vector<GPT2Block<T, subplan<Plan, "h.*">>> h;
  LayerNorm<T, style_at<Plan, "ln_f">> ln_f;
  Linear<T, style_at<Plan, "lm_head">> lm_head;
  SHARDWISE_CHILDREN(wte, wpe, h, ln_f, lm_head)

  explicit GPT2(GPT2Config const& c)
      : wte(c.vocabulary, c.dim, c.seed),
        wpe(c.sequence, c.dim, c.seed + 1),
        ln_f(c.dim, static_cast<T>(c.layer_norm_eps)),
        lm_head(c.dim, c.vocabulary, c.seed + 2, false),
        config_(c) {
    if (c.heads == 0 || c.dim % c.heads != 0)
      gpt2_fail("shardwise::models::GPT2: dim ", c.dim, " does not divide into ", c.heads,
                " heads; choose a dim that is a multiple of the heads");
    // transformers' initializer_range: N(0, 0.02) embeddings (Embedding draws N(0, 1)); a lazily constructed
    // table is empty here and filled from a checkpoint.
    wte.weight *= T(0.02);
    wpe.weight *= T(0.02);
    h.reserve(c.layers);
    for (std::size_t i = 0; i < c.layers; ++i) h.emplace_back(c, c.seed + 100 * (i + 1));
    tie_weights(lm_head, wte);  // the plan must cut both the same way: checked at compile time
  }

  [[nodiscard]] GPT2Config const& config() const { return config_; }

  /// Called by sw::parallelize before any layer is cut: a vocabulary (or, where the plan cuts wpe, a
  /// position count) the tp size does not divide is padded with zero rows no id reaches, as Megatron does.
  void shardwise_on_parallelize(int tp) {
    auto const ranks = static_cast<std::size_t>(tp);
    std::size_t const padded = (config_.vocabulary + ranks - 1) / ranks * ranks;
    wte.pad_vocabulary(padded);
    lm_head.pad_outputs(padded);  // tied: wte pads the shared table; this only widens the logits
    if constexpr (is_rowwise_v<typename decltype(wpe)::style>)
      wpe.pad_vocabulary((config_.sequence + ranks - 1) / ranks * ranks);
  }

  auto forward(std::span<const std::int64_t> ids) {
    auto x = wte(ids) + wpe(positions(ids.size()));
    for (auto& block : h) x = block.forward(x);
    return lm_head(ln_f(x));
  }

  template <class DY>
  void backward(DY const& dlogits) {
    auto dx = ln_f.backward(lm_head.backward(dlogits));
    for (auto block = h.rbegin(); block != h.rend(); ++block) dx = block->backward(dx);
    wte.backward(dx);
    wpe.backward(dx);  // the sum's gradient reaches both embeddings unchanged
  }

 private:
  /// The position of every token: 0, 1, ..., sequence - 1, again for each sequence of the batch.
  std::span<const std::int64_t> positions(std::size_t tokens) {
    if (tokens % config_.sequence != 0)
      gpt2_fail("shardwise::models::GPT2: ", tokens, " ids are not whole sequences of ", config_.sequence,
                " tokens; give forward a batch of complete sequences");
    positions_.resize(tokens);
    for (std::size_t i = 0; i < tokens; ++i) positions_[i] = static_cast<std::int64_t>(i % config_.sequence);
    return positions_;
  }

  GPT2Config config_;
  std::vector<std::int64_t> positions_;
};

}  // namespace shardwise::models
