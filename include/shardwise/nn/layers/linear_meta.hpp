#pragma once
// A Linear of a shape-only module (element type sw::meta<T>): no parameters and no product, but the same shapes
// in and out as the real layer under the same style, the same input kept for backward, and its declared cost
// (linear_core<T, Rule>::shardwise_cost, which its style's mover states) recorded in its trace each time the
// module's code calls it. What a module costs is then what its code calls, in the order it calls it.
#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "shardwise/nn/layers/linear_core.hpp"  // the real core, whose cost this one records
#include "shardwise/nn/meta.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise::detail {

/// The shape-only Linear under style Rule.
template <class T, class Rule>
class linear_core<meta<T>, Rule> {
  using real = linear_core<T, Rule>;
  using layouts = linear_layouts<Rule>;
  using mover = typename Rule::mover;
  static constexpr bool serial = std::is_same_v<Rule, unsharded_linear>;

 protected:
  static constexpr bool cut_rows = layouts::cut_rows, cut_cols = layouts::cut_cols;

 public:
  SHARDWISE_SAVED(kept_)
  using input_layout = typename layouts::in;               ///< As the real layer's.
  using output_layout = typename layouts::out;             ///< As the real layer's.
  using input_grad_layout = typename layouts::input_grad;  ///< As the real layer's.
  using weight_grad_placement = typename layouts::weight;  ///< As the real layer's.
  using bias_grad_placement = typename layouts::bias;      ///< As the real layer's.
  using matrix = meta_matrix<T>;                           ///< A shape.

  /// The sizes only (`path` and `seed` as the real layer takes them).
  constexpr linear_core(std::string_view, std::size_t in, std::size_t out, init, bool with_bias)
      : in_(in), out_(out), has_bias_(with_bias) {}

  /// As the real layer's before parallelize: `copies` of every output block (key-value heads repeated for tp).
  constexpr void replicate_output_blocks(std::size_t, std::size_t copies) { out_ *= copies, copies_ = copies; }
  /// As the real layer's: its cost's shard already counts the padding.
  constexpr linear_core& pad_outputs_for_tp() { return *this; }

  /// @{ No values: what sw::tie_weights hands another tied shape-only Linear.
  meta_values weight, weight_grad;
  /// @}
  [[nodiscard]] constexpr std::size_t in_features() const { return in_; }    ///< Input features (unsharded).
  [[nodiscard]] constexpr std::size_t out_features() const { return out_; }  ///< Output features (unsharded).
  /// Tied (sw::tie_weights): it computes with another layer's parameters, which that layer counts.
  constexpr void shardwise_tie(meta_values&, meta_values&, std::string_view) { counted_ = tied_ = true; }
  /// As the real layer's: a copy of another stage's weight, which this stage holds and counts.
  constexpr void mirror_weight_of(std::string_view) {}

  /// The real layer's cost (sw::cost), which a call records.
  static constexpr cost shardwise_cost(std::size_t in, std::size_t out, cost_inputs const& s, bool with_bias = false) {
    return real::shardwise_cost(in, out, s, with_bias);
  }

  /// Calls fn(sw::parameter_cost) for each parameter the real layer's walk gives (a tied weight is its owner's).
  template <class Fn>
  constexpr void shardwise_parameter_costs(cost_inputs const& s, Fn&& fn) const {
    bool skip_weight = tied_;
    real::shardwise_parameter_costs(linear_shape{in_, out_ / copies_, has_bias_, copies_}, s,
                                    [&](parameter_cost const& p) {
                                      if (!std::exchange(skip_weight, false)) fn(p);
                                    });
  }

  /// Backward: records the layer's backward transfers (and, for a Partial<Sum> gradient, its reduction into the
  /// output's layout, as the real layer makes it) and returns the input gradient's shape.
  template <class P>
  constexpr Activation<meta<T>, input_grad_layout> backward(Activation<meta<T>, P> const& dy) {
    meta_trace& trace = *dy.local.trace();
    cost_inputs const& s = trace.inputs;
    if constexpr (std::is_same_v<P, Partial<Sum>> && !std::is_same_v<output_layout, Partial<Sum>>)
      mover::template add_cost<Partial<Sum>, output_layout>(trace.transfers(), s.tokens, out_, sizeof(T), s);
    real::add_backward_cost(trace.transfers(), in_, out_, s);
    return {dy.local.like(meta_rows<input_grad_layout>(s), meta_cols<input_grad_layout>(in_, ranks(s), s.tp_rank))};
  }

 protected:
  /// Forward: keeps what the real layer keeps (the product's input) and records the forward's transfers.
  constexpr Activation<meta<T>, output_layout> forward_given(matrix const& given) {
    meta_trace& trace = *given.trace();
    kept_ = given.like(static_cast<std::ptrdiff_t>(trace.inputs.tokens), product_in_cols(trace.inputs));
    return record_forward(trace, given);
  }
  /// As above, on an input the caller gives up: kept without a copy where the real layer keeps it as given.
  constexpr Activation<meta<T>, output_layout> forward_taken(matrix& given) {
    if constexpr (!same_layout_v<input_layout, typename layouts::product_in>) {
      return forward_given(given);
    } else {
      Activation<meta<T>, output_layout> y = record_forward(*given.trace(), given);
      kept_ = std::move(given);
      return y;
    }
  }

 private:
  [[nodiscard]] static constexpr std::size_t ranks(cost_inputs const& s) { return serial ? 1 : s.tp; }
  [[nodiscard]] constexpr std::ptrdiff_t product_in_cols(cost_inputs const& s) const {
    return static_cast<std::ptrdiff_t>(shard_extent(in_, cut_cols, ranks(s)));
  }
  constexpr Activation<meta<T>, output_layout> output_like(meta_trace const& trace, matrix const& given) const {
    cost_inputs const& s = trace.inputs;
    return {given.like(meta_rows<output_layout>(s), meta_cols<output_layout>(out_, ranks(s), s.tp_rank))};
  }
  constexpr Activation<meta<T>, output_layout> record_forward(meta_trace& trace, matrix const& given) {
    Activation<meta<T>, output_layout> y = output_like(trace, given);
    record(trace);
    return y;
  }
  /// The forward's transfers, and the parameters' bytes the first time the layer is called.
  constexpr void record(meta_trace& trace) {
    real::add_forward_cost(trace.transfers(), in_, out_, trace.inputs);
    if (!counted_) {
      std::size_t const bytes = real::parameter_bytes(in_, out_, trace.inputs, has_bias_);
      trace.total.parameter_bytes += bytes, trace.total.gradient_bytes += bytes;
    }
    counted_ = true;
  }

  std::size_t in_, out_, copies_ = 1;
  bool has_bias_;
  bool counted_ = false, tied_ = false;
  matrix kept_;
};

}  // namespace shardwise::detail
