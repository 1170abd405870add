#pragma once
// A norm of a shape-only module (element type sw::meta<T>): no parameters and no arithmetic, but the shapes the
// real norm gives and keeps, and its declared cost (norm_core<T, Layout, Kind>::shardwise_cost) recorded in the
// trace when the module's code calls it. A Partial<Sum> gradient handed to it is reduced first, as by the real
// norm, and the reduction recorded.
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/nn/layers/norm.hpp"  // the real core, whose cost this one records
#include "shardwise/nn/meta.hpp"

namespace shardwise::detail {

/// The shape-only norm in layout Layout.
template <class T, class Layout, norm_kind Kind>
class norm_core<meta<T>, Layout, Kind> {
  using real = norm_core<T, Layout, Kind>;

 public:
  SHARDWISE_SAVED(kept_)
  using layout = Layout;                                 ///< As the real norm's.
  using input_layout = layout;                           ///< As the real norm's.
  using output_layout = layout;                          ///< As the real norm's.
  using grad_placement = typename real::grad_placement;  ///< As the real norm's.
  using matrix = meta_matrix<T>;                         ///< A shape.

  /// The size only (`path` and `eps` as the real norm takes them).
  constexpr norm_core(std::string_view, std::size_t features, meta<T>, init = {}) : features_(features) {}

  /// The real norm's cost (sw::cost), which a call records.
  static constexpr cost shardwise_cost(std::size_t features, cost_inputs const& s = {}) {
    return real::shardwise_cost(features, s);
  }

  /// Forward: keeps what the real norm keeps (its input and the per-token statistics) and returns the output's
  /// shape; the parameters' bytes are recorded the first time.
  constexpr Activation<meta<T>, layout> forward_local(matrix const& x) {
    meta_trace& trace = *x.trace();
    // What the real norm keeps: its input and one statistic (LayerNorm: two) per row it was given.
    kept_ = x.like(x.rows() * (x.cols() + (Kind == norm_kind::layer ? 2 : 1)), 1);
    if (!counted_) {
      cost const c = real::shardwise_cost(features_, trace.inputs);
      trace.total.parameter_bytes += c.parameter_bytes, trace.total.gradient_bytes += c.gradient_bytes;
    }
    counted_ = true;
    return {x.like(x.rows(), x.cols())};
  }

  /// Calls fn(sw::parameter_cost) for each parameter, as the real norm's walk gives them.
  template <class Fn>
  constexpr void shardwise_parameter_costs(cost_inputs const& s, Fn&& fn) const {
    real::shardwise_parameter_costs(norm_shape{features_}, s, fn);
  }

  /// Backward: the input gradient's shape (a Partial<Sum> gradient reduced into the norm's layout first).
  template <class P>
  constexpr Activation<meta<T>, layout> backward(Activation<meta<T>, P> const& dy) {
    meta_trace& trace = *dy.local.trace();
    cost_inputs const& s = trace.inputs;
    if constexpr (std::is_same_v<P, Partial<Sum>> && !std::is_same_v<layout, Partial<Sum>>)
      layout_engine::add_cost<Partial<Sum>, layout>(trace.transfers(), s.tokens, features_, sizeof(T), s);
    if constexpr (std::is_same_v<P, layout>) return {dy.local.like(dy.local.rows(), dy.local.cols())};
    return {dy.local.like(meta_rows<layout>(s), static_cast<std::ptrdiff_t>(features_))};
  }

 private:
  std::size_t features_;
  bool counted_ = false;
  matrix kept_;
};

}  // namespace shardwise::detail
