#pragma once
// Training a parallelized model: gradients finished over the tensor-parallel group (Partial ones summed),
// averaged over data parallelism, clipped by the global norm, and AdamW — plain or ZeRO-1, where each
// data-parallel rank keeps the moments of only its slice of every parameter, the gradients are
// reduce-scattered and the updated slices all-gathered.
#include <cmath>
#include <cstddef>
#include <span>
#include <tuple>
#include <type_traits>
#include <vector>

#include "shardwise/nn/parameter.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

namespace detail {

template <class L>
using parameters_t = decltype(std::declval<L&>().parameters());

template <class Tuple>
struct tuple_has_partial;
template <class... Ps>
struct tuple_has_partial<std::tuple<Ps...>> : std::bool_constant<(is_partial_v<typename Ps::grad_placement> || ...)> {};

/// Whether any layer under Node has a Partial gradient type (a norm under SequenceParallel).
template <class Node>
constexpr bool has_partial_gradients() {
  using N = std::remove_cvref_t<Node>;
  if constexpr (layer<N>) {
    return tuple_has_partial<parameters_t<N>>::value;
  } else if constexpr (module<N>) {
    using Children = children_t<N>;
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return (has_partial_gradients<std::tuple_element_t<I, Children>>() || ...);
    }
    (std::make_index_sequence<std::tuple_size_v<Children>>{});
  } else if constexpr (repeated<N>::value) {
    return has_partial_gradients<typename repeated<N>::element>();
  } else {
    return false;
  }
}

/// Calls fn(parameter) for every parameter of every layer, in a fixed order (the optimizer's state follows it).
/// A gradient not allocated yet (a layer filled from a checkpoint, before its first backward) is allocated as
/// zeros first, so optimizers, clipping and reductions always see a whole gradient.
template <class Model, class Fn>
void for_each_parameter(Model& model, Fn&& fn) {
  for_each_layer(model, [&](auto& l) {
    std::apply([&](auto const&... p) { ((ensure_gradient(p), fn(p)), ...); }, l.parameters());
  });
}

/// Sums the gradients of replicated blocks (Parameter::copies) over the tp group: every copy of a block then
/// holds the gradient of the one block of the unsharded model, so the copies stay equal after the update.
template <class P>
void sum_over_copies(P const& p) {
  using T = typename P::tensor_type::Scalar;
  auto& grad = *p.grad;
  if (p.copies <= 1 || p.group == nullptr || grad.size() == 0) return;
  auto const rows = static_cast<std::size_t>(grad.rows());
  auto const cols = static_cast<Eigen::Index>(static_cast<std::size_t>(grad.size()) / rows);
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
  detail::for_each_layer(model, [](auto& l) {
    if constexpr (requires { l.zero_grad(); }) l.zero_grad();
  });
}

/// A model whose gradients are complete: the only thing an optimizer takes.
template <class Model>
struct FinishedGradients {
  Model& model;
};

/// Sums every Partial gradient over the tensor-parallel group (the norms under SequenceParallel), and the
/// gradients of replicated key-value heads over their copies.
template <class Model>
FinishedGradients<Model> finish_gradients(Model& model) {
  detail::for_each_parameter(model, [](auto const& p) {
    using P = std::remove_cvref_t<decltype(p)>;
    if constexpr (is_partial_v<typename P::grad_placement>)
      (void)reduce(p);
    else if constexpr (std::is_same_v<typename P::grad_placement, Shard<0>>)
      detail::sum_over_copies(p);  // replicated blocks are rows of a ColwiseParallel weight
  });
  return {model};
}

template <class T>
struct AdamWOptions {
  T learning_rate = T(1e-3);
  T beta1 = T(0.9), beta2 = T(0.999), eps = T(1e-8), weight_decay = T(0.01);
  T max_grad_norm = T(0);  // 0: no clipping
  bool zero1 = false;      // shard the moments over data parallelism
};

/// torch.optim.AdamW (decoupled weight decay, bias correction), with global-norm clipping and optional ZeRO-1.
/// Declared before the model is parallelized, as users write it: state is allocated at the first step, and
/// then only for this rank's slice.
template <class T>
class AdamW {
 public:
  explicit AdamW(AdamWOptions<T> options) : options_(options) {}

  /// One step. `dp` is the data-parallel 1-D mesh (a serial one for none); gradients are averaged over it.
  /// Returns the global gradient norm before clipping.
  template <class Model, class DataMesh>
  T step(FinishedGradients<Model> ready, DataMesh const& dp) {
    Model& model = ready.model;
    ++steps_;
    int const dp_size = dp.size(0), dp_rank = dp.coordinate(0);
    auto const& dp_comm = dp.comm(0);
    // 1. Average over data parallelism: the whole gradient, or (ZeRO-1) this rank's slice of it.
    std::size_t index = 0;
    T square_sum = 0;
    detail::for_each_parameter(model, [&](auto const& p) {
      using P = std::remove_cvref_t<decltype(p)>;
      T* grad = p.grad->data();
      auto const n = static_cast<std::size_t>(p.grad->size());
      slice& s = slice_of(index++, n, dp_size, dp_rank);
      bool const sliced = options_.zero1 && dp_size > 1;
      if (dp_size > 1) {
        Eigen::Map<nn::vector<T>> whole(grad, static_cast<Eigen::Index>(n));
        if (sliced)
          detail::reduce_scatter_on(dp_comm, whole, s.grad, 0, detail::op_kind::avg);
        else
          detail::all_reduce_on(dp_comm, whole, detail::op_kind::avg);
      }
      T const* g = sliced ? s.grad.data() : grad + s.start;
      // 2. The global norm: a gradient that is not sharded over tp is the same on every tp rank (Partial ones
      // have been summed by finish_gradients), so only tp rank 0 counts it; a replicated block counts once.
      int const tp_rank = p.group ? p.group->rank() : 0;
      if (is_shard_v<typename P::grad_placement> || tp_rank == 0) {
        T squares = 0;
        for (std::size_t i = 0; i < s.count; ++i) squares += g[i] * g[i];
        square_sum += squares / static_cast<T>(p.copies);
      }
    });
    // Sum the squares over the tp group (sharded gradients) and, under ZeRO-1, over dp (disjoint slices).
    nn::vector<T> total(1);
    total(0) = square_sum;
    bool have_group = false;
    detail::for_each_parameter(model, [&](auto const& p) {
      if (!have_group && p.group) {
        p.group->all_reduce(total);
        have_group = true;
      }
    });
    if (options_.zero1 && dp_size > 1) detail::all_reduce_on(dp_comm, total, detail::op_kind::sum);
    T const norm = std::sqrt(total(0));
    T const clip =
        options_.max_grad_norm > 0 && norm > options_.max_grad_norm ? options_.max_grad_norm / (norm + T(1e-6)) : T(1);
    // 3. AdamW on this rank's slice, then (ZeRO-1) the updated slices gathered.
    T const correction1 = T(1) - std::pow(options_.beta1, T(steps_));
    T const correction2 = T(1) - std::pow(options_.beta2, T(steps_));
    index = 0;
    detail::for_each_parameter(model, [&](auto const& p) {
      slice& s = slices_[index++];
      T* value = p.value->data();
      T const* g = (dp_size > 1 && options_.zero1) ? s.grad.data() : p.grad->data() + s.start;
      T* w = value + s.start;
      for (std::size_t i = 0; i < s.count; ++i) {
        T const gi = g[i] * clip;
        w[i] -= options_.learning_rate * options_.weight_decay * w[i];
        s.m[i] = options_.beta1 * s.m[i] + (T(1) - options_.beta1) * gi;
        s.v[i] = options_.beta2 * s.v[i] + (T(1) - options_.beta2) * gi * gi;
        w[i] -= options_.learning_rate * (s.m[i] / correction1) / (std::sqrt(s.v[i] / correction2) + options_.eps);
      }
      if (options_.zero1 && dp_size > 1) {
        auto const n = static_cast<std::size_t>(p.value->size());
        nn::vector<T> const mine = Eigen::Map<nn::vector<T>>(w, static_cast<Eigen::Index>(s.count));
        Eigen::Map<nn::vector<T>> whole(value, static_cast<Eigen::Index>(n));
        detail::all_gather_on(dp_comm, mine, whole, 0);
      }
    });
    return norm;
  }

  /// A model whose gradients need no finishing (no Partial ones) may be passed directly.
  template <module Model, class DataMesh>
  T step(Model& model, DataMesh const& dp) {
    static_assert(!detail::has_partial_gradients<Model>(),
                  "shardwise::AdamW::step: the model has Partial gradients (norms under SequenceParallel) that no "
                  "rank holds whole yet; pass sw::finish_gradients(model) instead of the model");
    return step(FinishedGradients<Model>{model}, dp);
  }

  /// The state, for checkpoints: allocates it as the first step would (this rank's slice of every parameter,
  /// in the model's parameter order) if no step has yet, then calls fn(index, start, m, v) per parameter, where
  /// m and v (first and second moments) cover elements [start, start + m.size()) of the flattened local tensor.
  template <class Model, class DataMesh, class Fn>
  void for_each_state(Model& model, DataMesh const& dp, Fn&& fn) {
    std::size_t index = 0;
    detail::for_each_parameter(model, [&](auto const& p) {
      slice& s = slice_of(index, static_cast<std::size_t>(p.value->size()), dp.size(0), dp.coordinate(0));
      if (s.start + s.count > static_cast<std::size_t>(p.value->size()))
        detail::fail("shardwise::AdamW: the state of parameter ", index, " (\"", p.path,
                     "\") does not fit it; use one optimizer per model");
      fn(index, s.start, std::span<T>(s.m), std::span<T>(s.v));
      ++index;
    });
  }
  /// Steps taken (bias correction depends on it); set when resuming from a checkpoint.
  [[nodiscard]] std::size_t steps() const { return steps_; }
  void set_steps(std::size_t steps) { steps_ = steps; }
  [[nodiscard]] AdamWOptions<T> const& options() const { return options_; }

  /// Elements of optimizer state this rank holds (moments): with ZeRO-1, about 2 x parameters / dp.
  [[nodiscard]] std::size_t state_elements() const {
    std::size_t n = 0;
    for (auto const& s : slices_) n += s.m.size() + s.v.size();
    return n;
  }

 private:
  struct slice {
    std::size_t start = 0, count = 0;  // this rank's range of the flattened parameter
    std::vector<T> m, v;
    nn::vector<T> grad;  // ZeRO-1: the reduce-scattered gradient slice
  };

  slice& slice_of(std::size_t index, std::size_t n, int dp_size, int dp_rank) {
    if (index == slices_.size()) {
      slice s;
      if (options_.zero1) {
        s.start = chunk_offset(n, static_cast<std::size_t>(dp_size), static_cast<std::size_t>(dp_rank));
        s.count = chunk_size(n, static_cast<std::size_t>(dp_size), static_cast<std::size_t>(dp_rank));
      } else {
        s.count = n;
      }
      s.m.assign(s.count, T(0));
      s.v.assign(s.count, T(0));
      s.grad.resize(static_cast<Eigen::Index>(s.count));
      slices_.push_back(std::move(s));
    }
    return slices_[index];
  }

  AdamWOptions<T> options_;
  std::size_t steps_ = 0;
  std::vector<slice> slices_;
};

}  // namespace shardwise
