#pragma once
// A model's parameters, by name: sw::for_each_parameter(model, fn) calls fn(name, parameter) for every
// parameter ("layers.0.attention.wq.weight", as checkpoints name it), in one fixed order; sw::full_tensor and
// sw::full_gradient gather one to its unsharded shape. Gradients are finished — Partial ones summed over the
// group, repeated blocks' copies summed — by sw::finish_gradients, whose result is the only thing an optimizer
// takes and, walked, shows every gradient with its true placement.
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "shardwise/nn/layers/parameter.hpp"
#include "shardwise/nn/parameter_list.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

/// A model whose gradients are complete: returned by sw::finish_gradients, taken by optimizers.
template <class Model>
struct FinishedGradients {
  Model& model;  ///< The model, its gradients complete.
};

namespace detail {
template <class Layer, class Name, class Fn>
void for_each_present_parameter(Layer& l, Name const& path, Fn& fn) {
  std::apply(
      [&](auto const&... p) {
        (
            [&](auto const& q) {
              if (!q.present) return;
              if constexpr (std::is_same_v<Name, unnamed>)
                if (!is_frozen(q)) ensure_gradient(q);
              if constexpr (std::is_same_v<Name, unnamed>)
                fn(q);
              else
                fn(path.empty() ? std::string(q.leaf) : path + "." + std::string(q.leaf), q);
            }(p),
            ...);
      },
      l.parameters());
}

/// Calls fn(parameter) for every parameter of every layer, in the order of sw::for_each_parameter (the
/// optimizer's state follows it), without building names. A gradient not allocated yet (a layer filled from a
/// checkpoint, before its first backward) is allocated as zeros first.
template <class Model, class Fn>
void for_each_parameter(Model& model, Fn&& fn) {
  for_each_layer(model, [&](auto& l) { for_each_present_parameter(l, unnamed{}, fn); });
}
}  // namespace detail

/// Calls fn(name, parameter) for every parameter of the model, in a fixed order: `name` is its place in the
/// model with the layer's parameter name ("layers.0.attention.wq.weight"); `parameter.value` and
/// `parameter.grad` point to this rank's shard of it and of its gradient, and its type's grad_placement says how
/// the gradient lies on the tensor-parallel axis (Shard<0>, Shard<1>, Replicate, or Partial<Sum> until
/// finished). A layer without bias has no bias here; a tied weight appears once, under its owner's name. The
/// walk allocates nothing: a gradient a lazily loaded layer has not allocated yet (no backward so far) is empty.
template <module Model, class Fn>
void for_each_parameter(Model& model, Fn&& fn) {
  detail::for_each_named_layer(
      model, [&](auto& l, std::string const& path) { detail::for_each_present_parameter(l, path, fn); });
}

/// The same walk over a model whose gradients are finished: every gradient as the optimizer sees it, with its
/// true placement (a norm's gradient under sequence parallelism is Replicate here, summed over the group). A frozen
/// parameter (sw::freeze) has no gradient and is left out.
template <class Model, class Fn>
void for_each_parameter(FinishedGradients<Model> finished, Fn&& fn) {
  for_each_parameter(finished.model, [&](std::string const& name, auto const& p) {
    if (!detail::is_frozen(p)) fn(name, detail::finished_view(p));
  });
}

namespace detail {
/// The unsharded tensor of `t`, this rank's shard of parameter p's value or gradient: gathered over the group
/// when the placement cuts it, with repeated blocks kept once and vocabulary padding left out.
template <class P>
typename P::tensor_type gather_whole(P const& p, typename P::tensor_type const& t, bool sharded, int dim) {
  using Tensor = typename P::tensor_type;
  using T = typename Tensor::Scalar;
  nn::matrix<T> whole = Eigen::Map<nn::matrix<T> const>(t.data(), t.rows(), t.cols());
  if (sharded && p.group && p.group->size() > 1) {
    nn::matrix<T> gathered;
    p.group->all_gather(whole, gathered, dim);
    whole = std::move(gathered);
  }
  if (p.copies > 1) {  // every copy of a block holds the same values: keep the first
    auto const block = static_cast<Eigen::Index>(p.copy_block), copies = static_cast<Eigen::Index>(p.copies);
    nn::matrix<T> first(whole.rows() / copies, whole.cols());
    for (Eigen::Index b = 0; b < first.rows() / block; ++b)
      first.middleRows(b * block, block) = whole.middleRows(b * copies * block, block);
    whole = std::move(first);
  }
  if (p.real_rows != 0 && static_cast<std::size_t>(whole.rows()) > p.real_rows)
    whole.conservativeResize(static_cast<Eigen::Index>(p.real_rows), whole.cols());
  return Eigen::Map<Tensor const>(whole.data(), whole.rows(), Tensor::ColsAtCompileTime == 1 ? 1 : whole.cols());
}

template <class G>
constexpr int gather_dim() {
  if constexpr (is_shard_v<G>)
    return G::dim < 0 ? G::dim + 2 : G::dim;
  else
    return 0;
}
}  // namespace detail

/// The whole unsharded value of a parameter (collective: every rank of its group calls it), as the unsharded
/// model holds it: gathered where the plan cuts it, repeated key-value heads once, vocabulary padding left out.
template <class Tensor, class G>
Tensor full_tensor(Parameter<Tensor, G> const& p) {
  return detail::gather_whole(p, *p.value, is_shard_v<G>, detail::gather_dim<G>());
}

/// The whole unsharded gradient of a parameter (collective), once finished (see sw::finish_gradients).
template <class Tensor, class G>
Tensor full_gradient(Parameter<Tensor, G> const& p) {
  static_assert(!is_partial_v<G>,
                "shardwise::full_gradient: the gradient is still Partial (each rank holds a sum over its own "
                "tokens); walk sw::finish_gradients(model) instead of the model, or sw::reduce the parameter");
  detail::ensure_gradient(p);  // not allocated before the first backward: zeros
  return detail::gather_whole(p, *p.grad, is_shard_v<G>, detail::gather_dim<G>());
}

namespace detail {
/// Sums the gradients of replicated blocks (Parameter::copies) over the tp group: every copy of a block then
/// holds the gradient of the one block of the unsharded model, so the copies stay equal after the update.
/// Once summed, it does nothing until the next backward (which keeps the sum in the first copy only).
template <class T>
void sum_over_copies(listed_parameter<T> const& p) {
  tensor_slot<T> const& grad = p.grad;
  if (p.copies <= 1 || p.group == nullptr || grad.size() == 0) return;
  if (p.copies_summed && *p.copies_summed) return;
  auto const rows = static_cast<std::size_t>(grad.rows());
  auto const cols = static_cast<Eigen::Index>(grad.size() / rows);
  auto const rank = static_cast<std::size_t>(p.group->rank()), ranks = static_cast<std::size_t>(p.group->size());
  std::size_t const original_rows = rows * ranks / p.copies;
  auto original_row = [&](std::size_t i) {  // this rank's row i -> the row of the unsharded tensor it copies
    std::size_t const global = rank * rows + i, block = global / p.copy_block;
    return static_cast<Eigen::Index>((block / p.copies) * p.copy_block + global % p.copy_block);
  };
  nn::matrix<T> sum = nn::matrix<T>::Zero(static_cast<Eigen::Index>(original_rows), cols);
  Eigen::Map<nn::matrix<T>> mine(grad.data(), static_cast<Eigen::Index>(rows), cols);
  for (std::size_t i = 0; i < rows; ++i) sum.row(original_row(i)) += mine.row(static_cast<Eigen::Index>(i));
  p.group->all_reduce(sum);
  for (std::size_t i = 0; i < rows; ++i) mine.row(static_cast<Eigen::Index>(i)) = sum.row(original_row(i));
}
}  // namespace detail

/// Sets every layer's gradients to zero (after an optimizer step; backward accumulates).
template <class Model>
void zero_grad(Model& model) {
  for (detail::listed_layer const& l : detail::list_model<detail::model_element_t<Model>>(model, {}).layers)
    if (l.zero_grad) l.zero_grad(l.layer);
}

namespace detail {
/// One parameter's share of sw::finish_gradients: a Partial gradient summed over the group, the copies of a
/// replicated block summed. Call mark_copies_summed on every parameter of the layers after it.
template <class T>
void finish_gradient(listed_parameter<T> const& p) {
  if (p.frozen) return;  // no gradient
  if (p.partial) {
    p.ensure_gradient();
    if (p.group) p.group->all_reduce(p.grad.data(), p.grad.size(), op_kind::sum);
    if (p.reduced_into) {
      Eigen::Map<nn::vector<T>> into(p.reduced_into.data(), static_cast<Eigen::Index>(p.reduced_into.size()));
      Eigen::Map<nn::vector<T>> grad(p.grad.data(), static_cast<Eigen::Index>(p.grad.size()));
      into += grad;
      grad.setZero();
    }
  } else if (p.rows_sharded) {
    sum_over_copies(p);  // replicated blocks are rows of a ColwiseParallel weight
  }
}
/// Both of a layer's parameters share the flag: set it once every copy is summed.
template <class T>
void mark_copies_summed(listed_parameter<T> const& p) {
  if (p.copies_summed && p.copies > 1 && p.group) *p.copies_summed = true;
}
/// finish_gradient and mark_copies_summed for one typed parameter (a fully sharded model's slots).
template <class Tensor, class G>
void finish_gradient(Parameter<Tensor, G> const& p) {
  finish_gradient(list_entry<typename Tensor::Scalar>(p, {}));
}
template <class Tensor, class G>
void mark_copies_summed(Parameter<Tensor, G> const& p) {
  mark_copies_summed(list_entry<typename Tensor::Scalar>(p, {}));
}
}  // namespace detail

/// Finishes every gradient: sums the Partial ones over the tensor-parallel group (the norms under
/// SequenceParallel) and the gradients of replicated key-value heads over their copies. Calling it again adds
/// nothing (what was summed is not summed twice), also after more backward passes (gradient accumulation).
template <class Model>
FinishedGradients<Model> finish_gradients(Model& model) {
  auto const list = detail::list_model<detail::model_element_t<Model>>(model, {.allocate_gradients = true});
  for (auto const& p : list.parameters) detail::finish_gradient(p);
  for (auto const& p : list.parameters) detail::mark_copies_summed(p);
  return {model};
}

}  // namespace shardwise
