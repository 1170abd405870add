#pragma once
// An Embedding of a shape-only model (element type sw::meta<T>): no table and no lookup, but the shape the real
// table gives for the ids it is handed (sw::meta_ids: a count), the ids kept for the backward, and its declared
// cost (embedding_core<T, Rule>::shardwise_cost) recorded in the trace when the model's code calls it. A
// Partial<Sum> gradient handed to its backward is reduced first, as by the real table, and the reduction recorded.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "shardwise/nn/layers/embedding.hpp"  // the real core, whose cost this one records
#include "shardwise/nn/meta.hpp"

namespace shardwise::detail {

/// The shape-only Embedding under style Rule.
template <class T, class Rule>
class embedding_core<meta<T>, Rule> {
  using real = embedding_core<T, Rule>;
  using layouts = linear_layouts<Rule>;
  using mover = typename Rule::mover;

 public:
  SHARDWISE_SAVED(ids_)
  using output_layout = typename real::output_layout;                  ///< As the real table's.
  using grad_placement = typename real::grad_placement;                ///< As the real table's.
  using weight_grad_placement = typename real::weight_grad_placement;  ///< As the real table's.

  /// The sizes only (`path` and `seed` as the real table takes them).
  constexpr embedding_core(std::string_view, std::size_t vocabulary, std::size_t dim, init)
      : vocabulary_(vocabulary), dim_(dim) {}

  /// @{ No values: what sw::tie_weights hands a tied shape-only Linear.
  meta_values weight, weight_grad;
  /// @}

  [[nodiscard]] constexpr std::size_t vocabulary() const { return vocabulary_; }  ///< The real vocabulary.
  [[nodiscard]] constexpr std::size_t dim() const { return dim_; }                ///< The embedding width.

  /// The real table's cost (sw::cost), which a call records. Its shard is cut as the padded table's.
  static constexpr cost shardwise_cost(std::size_t vocabulary, std::size_t dim, cost_inputs const& s) {
    return real::shardwise_cost(vocabulary, dim, s);
  }

  /// The rows of `ids`, as shapes: [ids, dim] in output_layout (this rank's tokens of them under Shard<0>, its
  /// columns under Shard<1>); keeps the ids and records the forward's transfers, and the table's bytes the first
  /// time.
  constexpr Activation<meta<T>, output_layout> operator()(meta_ids const& ids) {
    meta_trace& trace = *ids.trace;
    cost_inputs const& s = trace.inputs;
    cost const c = real::shardwise_cost(vocabulary_, dim_, s);
    trace.add(c.forward);
    if (!counted_) trace.total.parameter_bytes += c.parameter_bytes, trace.total.gradient_bytes += c.gradient_bytes;
    counted_ = true;
    ids_ = meta_matrix<std::int64_t>(static_cast<std::ptrdiff_t>(ids.count), 1, &trace);
    return {meta_matrix<T>(meta_rows<output_layout>(s), meta_cols<output_layout>(dim_, s.tp, s.tp_rank), &trace)};
  }

  /// Calls fn(sw::parameter_cost) for the table, as the real table's walk gives it.
  template <class Fn>
  constexpr void shardwise_parameter_costs(cost_inputs const& s, Fn&& fn) const {
    real::shardwise_parameter_costs(embedding_shape{vocabulary_, dim_}, s, fn);
  }

  /// Backward: records its transfers (a Partial<Sum> gradient reduced into the output's layout first).
  template <class P>
  constexpr void backward(Activation<meta<T>, P> const& dy) {
    meta_trace& trace = *dy.local.trace();
    cost_inputs const& s = trace.inputs;
    if constexpr (std::is_same_v<P, Partial<Sum>> && !std::is_same_v<normalize_2d_t<output_layout>, Partial<Sum>>)
      mover::template add_cost<Partial<Sum>, output_layout>(trace.transfers(), s.tokens, dim_, sizeof(T), s);
    trace.add(real::shardwise_cost(vocabulary_, dim_, s).backward);
  }

 protected:
  bool pad_for_tp_ = false;  // as the real table's; its cost's shard already counts the padding

 private:
  std::size_t vocabulary_, dim_;
  bool counted_ = false;
  meta_matrix<std::int64_t> ids_;
};

}  // namespace shardwise::detail
