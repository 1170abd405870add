#pragma once
// Two transformer blocks written the way a user writes them against shardwise: the layers come from the
// plan by name, forward and backward are plain code. A parent calls them with sw::forward / sw::backward, which
// apply their own plan entries (PrepareModuleInput under sequence parallelism). Used by the examples and by
// the tests, which compare every sharded run with the same block built with sw::serial_plan.
#include <cstdint>
#include <shardwise/inference/cached_attention.hpp>
#include <shardwise/nn.hpp>
#include <utility>

namespace blocks {

namespace sw = shardwise;

/// SwiGLU feed-forward, as in Llama: w2(silu(w1(x)) * w3(x)).
template <class T, class Plan = sw::serial_plan>
struct FeedForward {
  sw::Linear<T, sw::layer_at<Plan, "w1">> w1;
  sw::Linear<T, sw::layer_at<Plan, "w3">> w3;
  sw::Linear<T, sw::layer_at<Plan, "w2">> w2;
  SHARDWISE_CHILDREN(w1, w3, w2)
  SHARDWISE_SAVED(h1_, h3_, a_)  // what forward keeps for backward: lets several microbatches be in flight

  FeedForward(std::size_t dim, std::size_t hidden, sw::init seed)
      : w1(dim, hidden, seed + 1, false), w3(dim, hidden, seed + 2, false), w2(hidden, dim, seed + 3, false) {}

  template <class X>
  auto forward(X const& x) {
    h1_ = w1(x);
    h3_ = w3(x);
    a_ = sw::silu(h1_);
    return w2(a_ * h3_);
  }

  /// Under ColwiseParallel on w1 and w3 the input gradient is Partial<Sum>: reduced once, by whoever needs it.
  template <class DY>
  auto backward(DY const& dy) {
    auto dp = w2.backward(dy);
    return w1.backward(sw::silu_backward(h1_, dp * h3_)) + w3.backward(dp * a_);
  }

 private:
  sw::output_t<decltype(w1)> h1_, h3_, a_;  // kept for backward
};

/// Causal multi-head self-attention over a batch of whole sequences (rows [sequences x sequence, dim]); q, k,
/// v and the output projection are Linear layers, and under ColwiseParallel on wq/wk/wv each rank holds whole
/// heads (heads / tp of them). Its heads are a child, sw::attention_heads, which checks that they divide over the
/// tp size. StaticHeads (optional): the head count known at compile time, so a static tp size that does not
/// divide it does not compile.
template <class T, class Plan = sw::serial_plan, std::size_t StaticHeads = sw::dynamic_size>
struct Attention {
  sw::Linear<T, sw::layer_at<Plan, "wq">> wq;
  sw::Linear<T, sw::layer_at<Plan, "wk">> wk;
  sw::Linear<T, sw::layer_at<Plan, "wv">> wv;
  sw::Linear<T, sw::layer_at<Plan, "wo">> wo;
  sw::attention_heads<Plan, StaticHeads> heads;  // count, width, sequence: checked by sw::parallelize
  SHARDWISE_CHILDREN(wq, wk, wv, wo, heads)
  SHARDWISE_SAVED(q_, k_, v_, saved_)

  Attention(std::size_t dim, std::size_t heads, std::size_t sequence, sw::init seed)
      : wq(dim, dim, seed + 1),
        wk(dim, dim, seed + 2),
        wv(dim, dim, seed + 3),
        wo(dim, dim, seed + 4),
        heads(dim, heads, sequence) {}

  template <class X>
  auto forward(X const& x) {
    q_ = wq(x), k_ = wk(x), v_ = wv(x);
    auto out = q_;  // same layout and shape: [tokens, local heads * head_dim]
    sw::nn::causal_attention<T>(q_.local, k_.local, v_.local, heads.sequence, heads.head_dim, out.local, saved_);
    return wo(std::move(out));  // a temporary: wo keeps its storage for backward instead of a copy
  }

  /// Forward with a key-value cache, for sw::generate: the step's new rows (a prompt's tokens, then one per
  /// sequence) attend to every token their sequence has cached; nn::cached_attention writes their keys and values
  /// into this layer's cache first. Locals, not members: nothing is kept for backward.
  template <class X>
  auto forward(X const& x, sw::cache_step const& step, sw::nn::kv_layer<T>& cache) {
    auto q = wq(x), k = wk(x), v = wv(x);
    auto out = q;
    sw::nn::cached_attention<T>(q.local, k.local, v.local, heads.head_dim, step, cache, out.local);
    return wo(std::move(out));
  }

  template <class DY>
  auto backward(DY const& dy) {
    auto dout = wo.backward(dy);
    auto dq = q_, dk = k_, dv = v_;
    sw::nn::causal_attention_backward<T>(dout.local, q_.local, k_.local, v_.local, saved_, dq.local, dk.local,
                                         dv.local);
    return wq.backward(dq) + wk.backward(dk) + wv.backward(dv);  // Partial<Sum> under ColwiseParallel: one reduction
  }

 private:
  sw::output_t<decltype(wq)> q_, k_, v_;  // kept for backward, with the softmax statistics in saved_
  sw::nn::attention_saved<T> saved_;
};

}  // namespace blocks
