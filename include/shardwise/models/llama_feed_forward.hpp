#pragma once
// The dense SwiGLU feed-forward of a Llama block, w2(silu(w1 x) * w3 x), which a mixture of experts
// (models/moe.hpp) also takes as each expert.
#include <tuple>
#include <utility>

#include "shardwise/models/llama_config.hpp"
#include "shardwise/nn.hpp"

namespace shardwise::models {

/// SwiGLU feed-forward: w2(silu(w1 x) * w3 x).
template <class T, class Plan = serial_plan>
struct LlamaFeedForward {
  Linear<T, layer_at<Plan, "w1">> w1;  ///< Gate projection, dim -> hidden (bias: mlp_bias).
  Linear<T, layer_at<Plan, "w3">> w3;  ///< Up projection, dim -> hidden (bias: mlp_bias).
  Linear<T, layer_at<Plan, "w2">> w2;  ///< Down projection, hidden -> dim (bias: mlp_bias).
  SHARDWISE_CHILDREN(w1, w3, w2)
  SHARDWISE_HOOKS(token_wise)
  SHARDWISE_SAVED(h1_, h3_, a_)
  static constexpr bool shardwise_token_wise = true;  ///< Each token alone: its sequences may be cut over cp.

  /// The parameters are drawn from seed + 1 .. seed + 3.
  constexpr LlamaFeedForward(LlamaConfig const& c, init seed)
      : w1(std::get<0>(shardwise_shapes(c)), seed + 1),
        w3(std::get<1>(shardwise_shapes(c)), seed + 2),
        w2(std::get<2>(shardwise_shapes(c)), seed + 3) {}

  /// The shapes of w1, w3 and w2, which the constructor builds them from and sw::parameter_costs walks.
  static constexpr auto shardwise_shapes(LlamaConfig const& c, std::size_t = 0) {
    return std::tuple{linear_shape{c.dim, c.hidden, c.mlp_bias}, linear_shape{c.dim, c.hidden, c.mlp_bias},
                      linear_shape{c.hidden, c.dim, c.mlp_bias}};
  }

  /// Its cost on one rank (sw::cost) for a config and s.tokens tokens: its own forward and backward, run on
  /// shapes (sw::derived_cost).
  static constexpr cost shardwise_cost(LlamaConfig const& c, cost_inputs const& s) {
    using input = Activation<meta<T>, typename decltype(w1)::input_layout>;
    return derived_cost<LlamaFeedForward<meta<T>, Plan>, input>(s, c.dim, c, 0);
  }

  /// Forward on x [tokens, dim]; keeps what backward needs.
  template <class X>
  constexpr auto forward(X const& x) {
    h1_ = w1(x), h3_ = w3(x);
    a_ = silu(h1_);
    return w2(a_ * h3_);
  }
  /// Backward of the last forward: accumulates the parameter gradients and returns the input gradient.
  template <class DY>
  constexpr auto backward(DY const& dy) {
    auto dp = w2.backward(dy);
    // Two statements, so that the first branch's temporaries are freed before the second's are made.
    auto dx = w1.backward(silu_backward(h1_, dp * h3_));  // the product's storage becomes the SiLU's gradient
    return dx + w3.backward(std::move(dp) * a_);          // and dp's becomes w3's output gradient
  }

 private:
  output_t<decltype(w1)> h1_, h3_, a_;
};

}  // namespace shardwise::models
