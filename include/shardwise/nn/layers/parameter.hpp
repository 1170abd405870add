#pragma once
// A parameter with its gradient, and the gradient's layout on the tensor-parallel axis in the type. A
// replicated weight used on sequence-sharded activations (a norm under SequenceParallel) has a Partial
// gradient: each rank holds the sum over its own tokens. An optimizer refuses it at compile time until
// reduce() has summed it over the group.
#include <cstddef>
#include <memory>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "shardwise/core/fixed_string.hpp"
#include "shardwise/nn/group.hpp"
#include "shardwise/placement/placement.hpp"

namespace shardwise {

class expert_parallel;

/// One parameter of a layer: its value (this rank's shard), its gradient, and the gradient's placement on the
/// tensor-parallel axis in the type. Layers hand them out through parameters(); sw::for_each_parameter walks
/// them with their names.
template <class Tensor, class GradPlacement>
struct Parameter {
  using tensor_type = Tensor;            ///< The value's and gradient's type (an Eigen matrix or vector).
  using grad_placement = GradPlacement;  ///< How the gradient lies on the tp axis.
  Tensor* value;                         ///< This rank's shard of the parameter.
  Tensor* grad;  ///< Its gradient; for a Partial one, the sum of this rank's contributions not yet reduced.
  nn::group<typename Tensor::Scalar> const* group;  ///< The layer's tp group (null before parallelize).
  std::string_view path;                            ///< The layer's plan path ("layers.*.attention.wq").
  /// Replicated blocks (key-value heads repeated so that more tp ranks than heads each hold one): each block of
  /// `copy_block` rows of the unsharded tensor appears `copies` times in a row. The copies' gradients are summed
  /// over the group (finish_gradients) and count once in the gradient norm.
  std::size_t copies = 1;
  std::size_t copy_block = 0;  ///< Rows per repeated block (see copies).
  /// Partial gradients only: the layer's gradient, into which reduce() adds the sum over the group (and then
  /// clears `grad`), so reducing twice adds nothing twice.
  Tensor* reduced_into = nullptr;
  /// Rows of the unsharded tensor that are the model's (0: all); the rest is vocabulary padding.
  std::size_t real_rows = 0;
  /// "weight", "bias": the parameter's name within its layer.
  std::string_view leaf = "weight";
  /// False for a bias the layer does not have and for a weight tied to another layer's (walked there).
  bool present = true;
  /// Replicated blocks only: whether the copies' gradients have been summed since the last backward.
  bool* copies_summed = nullptr;
  /// Set on a pipeline stage's copy of a weight another stage owns (an output projection tied to the first
  /// stage's embedding): the owner's name ("tok_embeddings.weight"). The copy's gradient is summed with the
  /// owner's each step, so both stay one value; it counts once in the global norm (at the owner) and
  /// checkpoints hold it once, under the owner's name.
  std::string_view mirror_of = {};
  /// The layer's flag that sw::freeze sets: a frozen parameter is not trained (its layer computes no gradient for
  /// it, optimizers keep no state for it, nothing reduces it). Null: the layer cannot freeze it.
  bool* frozen = nullptr;
  /// An expert's parameter placed over ep ranks (sw::expert_parallelize): its gradient sums every ep rank's
  /// tokens, so optimizers divide it by the ep size instead of averaging it over data parallelism. Null: none.
  expert_parallel const* placed_over = nullptr;
};

namespace detail {
/// Whether sw::freeze froze the parameter.
template <class P>
bool is_frozen(P const& p) {
  return p.frozen && *p.frozen;
}
}  // namespace detail

namespace detail {
/// A layer filled from a checkpoint (sw::Lazy, then a load) allocates its gradients on first use, not when it
/// is materialized: a load then holds the parameters and no more. Until backward has run, the gradient is
/// zero, as it is for a layer constructed eagerly.
template <class P>
void ensure_gradient(P const& p) {
  if (p.grad->size() != p.value->size()) p.grad->setZero(p.value->rows(), p.value->cols());
  if (p.reduced_into && p.reduced_into->size() != p.value->size())
    p.reduced_into->setZero(p.value->rows(), p.value->cols());
}

/// The parameter with its finished gradient: a Partial one seen through the gradient reduce() fills.
template <class Tensor, class P>
auto finished_view(Parameter<Tensor, P> const& p) {
  if constexpr (is_partial_v<P>) {
    Parameter<Tensor, Replicate> q{p.value,     p.reduced_into ? p.reduced_into : p.grad, p.group, p.path, p.copies,
                                   p.copy_block};
    q.real_rows = p.real_rows, q.leaf = p.leaf, q.present = p.present, q.mirror_of = p.mirror_of;
    q.frozen = p.frozen;
    return q;
  } else {
    return p;
  }
}
}  // namespace detail

/// Sums a partial gradient over the group; the result's type says it is reduced. The layer's gradient receives
/// the sum and the partial one is cleared, so calling it again (for logging, say) adds nothing.
template <class Tensor>
Parameter<Tensor, Replicate> reduce(Parameter<Tensor, Partial<Sum>> const& p) {
  detail::ensure_gradient(p);
  if (p.group) p.group->all_reduce(*p.grad);
  if (p.reduced_into) {
    *p.reduced_into += *p.grad;
    p.grad->setZero();
  }
  return detail::finished_view(p);
}
template <class Tensor, class P>
Parameter<Tensor, P> reduce(Parameter<Tensor, P> const& p) {
  return p;  // nothing pending
}

/// Every parameter of a tuple reduced.
template <class... Ps>
auto reduce(std::tuple<Ps...> const& parameters) {
  return std::apply([](auto const&... p) { return std::make_tuple(reduce(p)...); }, parameters);
}

namespace detail {
template <fixed_string Path, class Placement, class Spelled = spelled_t<Path>>
struct partial_gradient_reaches_optimizer;
}

/// Plain SGD, enough to show the rule: a Partial gradient does not compile here.
template <class T>
struct SGD {
  T learning_rate;  ///< The step size.

  /// w -= learning_rate * g for each parameter of the tuple (layer.parameters(), or sw::reduce of them).
  template <class... Ps>
  void step(std::tuple<Ps...> const& parameters) const {
    static_assert(((!is_partial_v<typename Ps::grad_placement>) && ...),
                  "shardwise::SGD::step: a gradient is still Partial (a replicated weight used on sequence-sharded "
                  "activations); pass the parameters through sw::reduce(...) first");
    std::apply([&](auto const&... p) { (update(p), ...); }, parameters);
  }

 private:
  template <class P>
  void update(P const& p) const {
    detail::ensure_gradient(p);
    *p.value -= learning_rate * *p.grad;
  }
};

}  // namespace shardwise
