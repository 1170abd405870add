#pragma once
// Training a parallelized model: gradients finished over the tensor-parallel group (Partial ones summed),
// averaged over data parallelism, clipped by the global norm, and AdamW — plain or ZeRO-1, where each
// data-parallel rank keeps the moments of only its slice of every parameter, the gradients are
// reduce-scattered and the updated slices all-gathered.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/experts/expert_parallel.hpp"
#include "shardwise/nn/layers/parameter.hpp"
#include "shardwise/nn/parameter_list.hpp"
#include "shardwise/nn/training/adamw_options.hpp"
#include "shardwise/nn/training/name_patterns.hpp"
#include "shardwise/nn/training/schedule.hpp"
#include "shardwise/nn/walk.hpp"
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
  return any_node<Node>([]<class N>() {
    if constexpr (layer<N>)
      return tuple_has_partial<parameters_t<N>>::value;
    else
      return false;
  });
}

}  // namespace detail

namespace detail {
/// x[i] = sqrt(x[i]), correctly rounded as std::sqrt is, four or two at a time where SSE2 has the instruction.
/// (Eigen's array sqrt trades the last bits of float precision for speed under its default EIGEN_FAST_MATH,
/// and std::sqrt in a loop does not vectorise while it may set errno.)
template <class T>
void exact_square_roots(T* x, std::size_t n) {
  std::size_t i = 0;
#if defined(__SSE2__)
  if constexpr (std::is_same_v<T, float>)
    for (; i + 4 <= n; i += 4) _mm_storeu_ps(x + i, _mm_sqrt_ps(_mm_loadu_ps(x + i)));
  if constexpr (std::is_same_v<T, double>)
    for (; i + 2 <= n; i += 2) _mm_storeu_pd(x + i, _mm_sqrt_pd(_mm_loadu_pd(x + i)));
#endif
  for (; i < n; ++i) x[i] = std::sqrt(x[i]);
}

/// The sum of x[i]^2 over n elements: each block of 4096 by Eigen's vectorised reduction, the blocks' sums added
/// in double. A running scalar sum in T waits four cycles per element on the previous addition (it was 1.4% of a
/// TP 2 step at dim 1024) and, in float, loses digits over a large gradient.
template <class T>
T sum_of_squares(T const* x, std::size_t n) {
  constexpr std::size_t block = 4096;
  double total = 0;
  for (std::size_t start = 0; start < n; start += block) {
    auto const count = static_cast<Eigen::Index>(std::min(block, n - start));
    total += static_cast<double>(Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1> const>(x + start, count).square().sum());
  }
  return static_cast<T>(total);
}
}  // namespace detail

/// torch.optim.AdamW (decoupled weight decay, bias correction), with parameter groups, global-norm clipping
/// and optional ZeRO-1. Declared before the model is parallelized, as users write it: state is allocated at the
/// first step, and then only for this rank's slice.
template <class T>
class AdamW {
 public:
  /// No state until the first step. Refuses a schedule that cannot describe a run (check_schedule).
  explicit AdamW(AdamWOptions<T> options) : options_(std::move(options)) { check_schedule(options_.schedule); }

  /// One step. `dp` is the data-parallel 1-D mesh (a serial one for none); gradients are averaged over it.
  /// Returns the global gradient norm before clipping.
  template <class Model, class DataMesh>
  T step(FinishedGradients<Model> ready, DataMesh const& dp) {
    return step_summing_norm(ready, dp, no_other_stages{});
  }

  /// One step of a pipeline stage: as step(ready, dp), with the global norm taken over every stage of the
  /// pipeline axis `pp` (each parameter lives on one stage, so the clipping is the unsharded model's).
  template <class Model, class DataMesh, class PipelineMesh>
  T step(FinishedGradients<Model> ready, DataMesh const& dp, PipelineMesh const& pp) {
    return step_summing_norm(ready, dp, summed_over_stages<PipelineMesh>{pp});
  }

  /// A model whose gradients need no finishing (no Partial ones) may be passed directly.
  template <module Model, class DataMesh>
  T step(Model& model, DataMesh const& dp) {
    static_assert(!detail::has_partial_gradients<Model>(),
                  "shardwise::AdamW::step: the model has Partial gradients (norms under SequenceParallel) that no "
                  "rank holds whole yet; pass sw::finish_gradients(model) instead of the model");
    return step(FinishedGradients<Model>{model}, dp);
  }

  /// One step of a fully sharded model (sw::fully_shard): it hands over its parameter shards and their
  /// gradients (already averaged over data parallelism), so the state is this rank's shards' by construction.
  /// The global norm sums every shard once, over tp and dp. Returns it, before clipping.
  template <class Sharded>
    requires requires(Sharded& m, T squares) { m.shardwise_sum_over_shards(squares); }
  T step(Sharded& model) {
    return step_shards(model, [](T squares) { return squares; });
  }

  /// One step of pipeline stages under FSDP (sw::run_pipeline_step over a sharded model): as step(sharded), with
  /// the global norm also summed over the pipeline axis `pp` (so the clipping is the unsharded model's).
  template <class Sharded, class PipelineMesh>
    requires requires(Sharded& m, T squares) { m.shardwise_sum_over_shards(squares); }
  T step(Sharded& model, PipelineMesh const& pp) {
    return step_shards(model, [&](T squares) {
      nn::vector<T> total = nn::vector<T>::Constant(1, squares);
      detail::all_reduce_on(pp.comm(0), total, detail::op_kind::sum);
      return total(0);
    });
  }

  /// The state of a fully sharded model, for checkpoints: fn(index, m, v) per parameter shard, in the model's
  /// order, with its first and second moments (as many elements as the shard; allocated as the first step
  /// would if no step has yet).
  template <class Sharded, class Fn>
    requires requires(Sharded& m, T squares) { m.shardwise_sum_over_shards(squares); }
  void for_each_state(Sharded& model, Fn&& fn) {
    stepped_shards_ = true;
    std::size_t index = 0;
    model.shardwise_for_each_shard([&](std::string_view name, std::span<T> value, std::span<T const>, T) {
      slice& s = shard_slice(index, name, value.size());
      fn(index++, std::span<T>(s.m), std::span<T>(s.v));
    });
  }

  /// The state, for checkpoints: allocates it as the first step would (this rank's slice of every parameter,
  /// in the order of sw::for_each_parameter) if no step has yet, then calls fn(index, start, m, v) per
  /// parameter, where m and v (first and second moments) cover elements [start, start + m.size()) of the
  /// flattened local tensor.
  template <class Model, class DataMesh, class Fn>
  void for_each_state(Model& model, DataMesh const& dp, Fn&& fn) {
    if (stepped_shards_)
      detail::fail(
          "shardwise::AdamW: this optimizer steps a fully sharded model (sw::fully_shard), whose state "
          "covers this rank's shards only; saving or loading it is not supported yet");
    auto const list = trainable(detail::list_model<T>(model, {.names = true}));
    for (std::size_t index = 0; index < list.parameters.size(); ++index) {
      slice& s = state_of(index, list.parameters[index], dp.size(0), dp.coordinate(0));
      fn(index, s.start, std::span<T>(s.m), std::span<T>(s.v));
    }
  }
  /// Steps taken (bias correction depends on it); set when resuming from a checkpoint.
  [[nodiscard]] std::size_t steps() const { return steps_; }
  void set_steps(std::size_t steps) { steps_ = steps; }                      ///< Sets the steps taken, when resuming.
  [[nodiscard]] AdamWOptions<T> const& options() const { return options_; }  ///< The options it was made with.
  /// Replaces the schedule (checked as the constructor does); a checkpoint's load restores the saved one.
  void set_schedule(LearningRateSchedule const& schedule) {
    check_schedule(schedule);
    options_.schedule = schedule;
  }
  /// The learning rate of the options (parameters in no group) at the step taken last, or at the next step before
  /// any: the options' learning rate times the schedule's factor. For progress lines.
  [[nodiscard]] T learning_rate() const { return scaled_rate(options_.learning_rate, steps_ == 0 ? 0 : steps_ - 1); }

  /// The transfers of step(ready, dp) on one rank (sw::cost), for the parameters `walk(fn)` visits in order
  /// (sw::parameter_cost; a model's shardwise_parameter_costs): each gradient averaged over dp (ZeRO-1:
  /// reduce-scattered), the squared norm summed over tp (and, ZeRO-1, over dp), then (ZeRO-1) each updated slice
  /// all-gathered. `dp_axis`: the data-parallel axis' name; `pp_axis`: for step(ready, dp, pp), the pipeline
  /// axis the squared norm is then summed over (empty: none). For a model given to sw::parallelize (its layers
  /// hold a tp group, over which the squared norm is summed even at tp 1).
  template <std::size_t Capacity = 48, class Walk>
  static constexpr transfer_list<Capacity> step_cost(Walk&& walk, bool zero1, std::size_t dp, std::size_t dp_rank,
                                                     cost_inputs const& s, std::string_view dp_axis = "dp",
                                                     std::string_view pp_axis = {}) {
    transfer_list<Capacity> list;
    bool const slices = zero1 && dp > 1;
    walk([&](parameter_cost const& p) {
      if (dp > 1)
        list.add(slices ? transfer_kind::reduce_scatter : transfer_kind::all_reduce, dp_axis,
                 p.elements * p.element_size);
    });
    list.add(transfer_kind::all_reduce, s.tp_axis, sizeof(T));
    if (slices) list.add(transfer_kind::all_reduce, dp_axis, sizeof(T));
    if (!pp_axis.empty()) list.add(transfer_kind::all_reduce, pp_axis, sizeof(T));
    if (slices)
      walk([&](parameter_cost const& p) {
        list.add(transfer_kind::all_gather, dp_axis, chunk_size(p.elements, dp, dp_rank) * p.element_size);
      });
    return list;
  }

  /// Bytes of optimizer state (state_elements) this rank holds after a step, for the parameters `walk(fn)`
  /// visits: two moments per element of its slice (ZeRO-1: its torch.chunk piece of each parameter over dp).
  /// ZeRO-1 also keeps the slice's averaged gradient: as many bytes again as one moment.
  template <class Walk>
  static constexpr std::size_t state_bytes(Walk&& walk, bool zero1, std::size_t dp, std::size_t dp_rank) {
    bool const slices = zero1 && dp > 1;
    std::size_t bytes = 0;
    walk([&](parameter_cost const& p) {
      bytes += 2 * (slices ? chunk_size(p.elements, dp, dp_rank) : p.elements) * sizeof(T);
    });
    return bytes;
  }

  /// Elements of optimizer state this rank holds (moments): with ZeRO-1, about 2 x parameters / dp.
  [[nodiscard]] std::size_t state_elements() const {
    std::size_t n = 0;
    for (auto const& s : slices_) n += s.m.size() + s.v.size();
    return n;
  }

 private:
  struct slice {
    std::size_t start = 0, count = 0;  // this rank's range of the flattened parameter
    T weight_decay = 0, learning_rate = 0;
    std::vector<T> m, v;
    nn::vector<T> grad;  // ZeRO-1: the reduce-scattered gradient slice
  };

  bool sliced(int dp_size) const { return options_.zero1 && dp_size > 1; }
  /// The list without its frozen parameters (sw::freeze), which hold no state: the state's order is the rest's.
  static detail::model_list<T> trainable(detail::model_list<T> list) {
    std::erase_if(list.parameters, [](detail::listed_parameter<T> const& p) { return p.frozen; });
    return list;
  }
  /// `rate` times the schedule's factor at `step` steps taken before, in double as LambdaLR computes it.
  T scaled_rate(T rate, std::size_t step) const {
    return static_cast<T>(static_cast<double>(rate) * learning_rate_factor(options_.schedule, step));
  }
  /// The state of a fully sharded model's parameter `index`: made on first use, then checked against its shard.
  slice& shard_slice(std::size_t index, std::string_view name, std::size_t count);

  /// step(sharded) with the squared norm, summed over the shards, then by sum_over_stages.
  template <class Sharded, class SumOverStages>
  T step_shards(Sharded& model, SumOverStages&& sum_over_stages) {
    ++steps_;
    stepped_shards_ = true;
    std::size_t index = 0;
    T squares = 0;
    model.shardwise_for_each_shard([&](std::string_view name, std::span<T> value, std::span<T const> grad, T weight) {
      (void)shard_slice(index++, name, value.size());
      squares += detail::sum_of_squares(grad.data(), grad.size()) * weight;
    });
    T const norm = std::sqrt(sum_over_stages(model.shardwise_sum_over_shards(squares)));
    T const clip = clip_factor(norm);
    index = 0;
    model.shardwise_for_each_shard([&](std::string_view, std::span<T> value, std::span<T const> grad, T) {
      adam_update(slices_[index++], value.data(), grad.data(), clip);
    });
    return norm;
  }

  /// What a step sums the squared norm over besides the model's ranks: nothing, or a pipeline's stages (not lambdas).
  struct no_other_stages {
    void operator()(nn::vector<T>&) const {}
  };
  template <class PipelineMesh>
  struct summed_over_stages {
    PipelineMesh const& pp;
    void operator()(nn::vector<T>& squares) const { detail::all_reduce_on(pp.comm(0), squares, detail::op_kind::sum); }
  };

  /// One step, with the squared norm also summed by sum_over_stages (over the pipeline axis, or nothing). The work
  /// after the model's list (step_listed) is compiled once per data mesh, not once per model.
  template <class Model, class DataMesh, class SumOverStages>
  T step_summing_norm(FinishedGradients<Model> ready, DataMesh const& dp, SumOverStages sum_over_stages) {
    return step_listed(detail::list_model<T>(ready.model, {.names = slices_.empty(), .allocate_gradients = true}), dp,
                       sum_over_stages);
  }

  template <class DataMesh, class SumOverStages>
  T step_listed(detail::model_list<T> listed, DataMesh const& dp, SumOverStages& sum_over_stages) {
    ++steps_;
    placed_ = nullptr;  // from every parameter, frozen ones too: every ep rank then sums the experts' squares
    for (auto const& p : listed.parameters) placed_ = p.placed_over ? p.placed_over : placed_;
    if (placed_) detail::check_expert_placement(*placed_, dp.comm(0), dp.size(0), options_.zero1);
    auto const list = trainable(std::move(listed));
    if (slices_.empty())  // the state, once, by name: parameter groups
      for (std::size_t index = 0; index < list.parameters.size(); ++index)
        (void)state_of(index, list.parameters[index], dp.size(0), dp.coordinate(0));
    list_parameters(list.parameters);
    T const norm = average_and_norm(dp, sum_over_stages);
    update(dp, clip_factor(norm));
    return norm;
  }

  /// What the gradients are multiplied by: torch.nn.utils.clip_grad_norm_'s max_norm / (norm + 1e-6), or 1.
  T clip_factor(T norm) const {
    return options_.max_grad_norm > 0 && norm > options_.max_grad_norm ? options_.max_grad_norm / (norm + T(1e-6))
                                                                       : T(1);
  }

  /// AdamW on the slice's elements w (gradient g), one step: one pass over memory in blocks that stay in the
  /// first-level cache, each block's arithmetic vectorised in the order of the scalar formula (exact square
  /// roots and divisions), so the result is the scalar loop's bit for bit wherever the compiler does not fuse
  /// multiply-adds (x86-64's default target; with -march=native and -ffp-contract=fast it may fuse either).
  void adam_update(slice& s, T* w, T const* g, T clip);

  /// One parameter as a step sees it. The step walks the model once to list them and runs on the list, so its
  /// collectives and arithmetic are compiled once per data mesh, not once per parameter type (most of a training
  /// program's build time was that).
  struct step_parameter {
    T* value = nullptr;
    T* grad = nullptr;  // finished: reduced over tp where it was Partial
    std::size_t value_elements = 0, grad_elements = 0;
    bool counted = false;  // this rank adds its squares to the global norm
    T copies = 1;          // ranks holding the same block (a replicated block counts once)
    nn::group<T> const* group = nullptr;
    expert_parallel const* placed_over = nullptr;  // an expert's placed over ep: summed, not averaged, over dp
  };

  /// Lists every parameter with its finished gradient (allocated if a lazy load left none), in the order of the
  /// slices; no names are built. A gradient not sharded over tp is the same on every tp rank, so only tp rank 0
  /// counts it; a mirrored one (another stage's copy) counts there.
  void list_parameters(std::vector<detail::listed_parameter<T>> const& listed);

  /// Averages the listed gradients over data parallelism (ZeRO-1: reduce-scatters this rank's slice) and returns
  /// the global norm.
  template <class DataMesh, class SumOverStages>
  T average_and_norm(DataMesh const& dp, SumOverStages& sum_over_stages) {
    int const dp_size = dp.size(0);
    T square_sum = 0;
    nn::vector<T> placed_squares = nn::vector<T>::Zero(1);  // placed experts' gradients: each ep rank's own
    nn::group<T> const* tp_group = nullptr;
    for (std::size_t index = 0; index < parameters_.size(); ++index) {
      step_parameter const& p = parameters_[index];
      slice& s = slices_[index];
      if (p.group) tp_group = p.group;  // a placed expert's too: cut over tp (expert tensor parallelism)
      if (p.placed_over) {  // the sum over its ep group's tokens: summed over its replicas, divided by the dp ranks
        Eigen::Map<nn::vector<T>> whole(p.grad, static_cast<Eigen::Index>(p.grad_elements));
        if (p.placed_over->replicas() > 1) p.placed_over->sum_over_replicas(whole);
        whole /= static_cast<T>(dp_size);
        if (p.counted) placed_squares(0) += detail::sum_of_squares(p.grad + s.start, s.count) / p.copies;
        continue;
      }
      if (dp_size > 1) {
        Eigen::Map<nn::vector<T>> whole(p.grad, static_cast<Eigen::Index>(p.grad_elements));
        if (sliced(dp_size))
          detail::reduce_scatter_on(dp.comm(0), whole, s.grad, 0, detail::op_kind::avg);
        else
          detail::all_reduce_on(dp.comm(0), whole, detail::op_kind::avg);
      }
      T const* g = sliced(dp_size) ? s.grad.data() : p.grad + s.start;
      if (p.counted) {
        square_sum += detail::sum_of_squares(g, s.count) / p.copies;
      }
    }
    // Sum the squares over the tp group (sharded gradients) and, under ZeRO-1, over dp (disjoint slices).
    if (placed_) placed_->sum(placed_squares);
    nn::vector<T> total(1);
    total(0) = square_sum + placed_squares(0);
    if (tp_group) tp_group->all_reduce(total);
    if (sliced(dp_size)) detail::all_reduce_on(dp.comm(0), total, detail::op_kind::sum);
    sum_over_stages(total);
    return std::sqrt(total(0));
  }

  /// AdamW on this rank's slice of every listed parameter, then (ZeRO-1) the updated slices gathered.
  template <class DataMesh>
  void update(DataMesh const& dp, T clip) {
    int const dp_size = dp.size(0);
    for (std::size_t index = 0; index < parameters_.size(); ++index) {
      step_parameter const& p = parameters_[index];
      slice& s = slices_[index];
      T const* g = sliced(dp_size) ? s.grad.data() : p.grad + s.start;
      T* w = p.value + s.start;
      adam_update(s, w, g, clip);
      if (sliced(dp_size)) {
        nn::vector<T> const mine = Eigen::Map<nn::vector<T>>(w, static_cast<Eigen::Index>(s.count));
        Eigen::Map<nn::vector<T>> whole(p.value, static_cast<Eigen::Index>(p.value_elements));
        detail::all_gather_on(dp.comm(0), mine, whole, 0);
      }
    }
  }

  /// The state of listed parameter `index` (made on first use), checked against the parameter: a fitting state
  /// is not proof of the same model, but a misfit is proof of another.
  slice& state_of(std::size_t index, detail::listed_parameter<T> const& p, int dp_size, int dp_rank);

  slice& slice_of(std::size_t index, std::string const& name, std::size_t n, int dp_size, int dp_rank);

  AdamWOptions<T> options_;
  std::size_t steps_ = 0;
  bool stepped_shards_ = false;  // by step(sharded): the slices are FSDP shards, not slices of the model's tensors
  std::vector<slice> slices_;
  std::vector<step_parameter> parameters_;   // this step's, kept so that a step does not allocate the list
  expert_parallel const* placed_ = nullptr;  // where the model's experts are placed (sw::expert_parallelize), or null
};

// The working members, out of the class, so that SHARDWISE_SEPARATE_KERNELS can take AdamW<float> and
// AdamW<double> from shardwise::separate_kernels (see the end of this file).
template <class T>
auto AdamW<T>::shard_slice(std::size_t index, std::string_view name, std::size_t count) -> slice& {
  slice& s = slices_.size() == index ? slice_of(index, std::string(name), count, 1, 0) : slices_[index];
  if (s.count != count)
    detail::fail("shardwise::AdamW: the state of parameter ", index, " (\"", name,
                 "\") does not fit its shard; use one optimizer per model");
  return s;
}

template <class T>
void AdamW<T>::adam_update(slice& s, T* w, T const* g, T clip) {
  using array = Eigen::Array<T, Eigen::Dynamic, 1>;
  T const correction1 = T(1) - std::pow(options_.beta1, T(steps_));
  T const correction2 = T(1) - std::pow(options_.beta2, T(steps_));
  T const lr = scaled_rate(s.learning_rate, steps_ - 1), decay = s.weight_decay;
  T const beta1 = options_.beta1, beta2 = options_.beta2;
  constexpr std::size_t block = 512;
  alignas(64) T root[block];  // sqrt(v / correction2) of one block
  for (std::size_t start = 0; start < s.count; start += block) {
    std::size_t const count = std::min(block, s.count - start);
    auto const n = static_cast<Eigen::Index>(count);
    Eigen::Map<array> weight(w + start, n), m(s.m.data() + start, n), v(s.v.data() + start, n), r(root, n);
    Eigen::Map<array const> const grad(g + start, n);
    m = beta1 * m + (T(1) - beta1) * (grad * clip);
    v = beta2 * v + (T(1) - beta2) * (grad * clip) * (grad * clip);
    r = v / correction2;
    detail::exact_square_roots(root, count);
    weight = (weight - lr * decay * weight) - (lr * (m / correction1)) / (r + options_.eps);
  }
}
template <class T>
void AdamW<T>::list_parameters(std::vector<detail::listed_parameter<T>> const& listed) {
  parameters_.clear();
  for (auto const& p : listed) {
    bool const counted = p.mirror_of.empty() && (p.sharded || (p.group ? p.group->rank() : 0) == 0);
    auto const grad = p.finished_grad();
    parameters_.push_back({p.value.data(), grad.data(), p.value.size(), grad.size(), counted, static_cast<T>(p.copies),
                           p.group, p.placed_over});
  }
}
template <class T>
auto AdamW<T>::state_of(std::size_t index, detail::listed_parameter<T> const& p, int dp_size, int dp_rank) -> slice& {
  slice& s = slice_of(index, p.name, p.value.size(), dp_size, dp_rank);
  if (s.start + s.count > p.value.size())
    detail::fail("shardwise::AdamW: the state of parameter ", index, " (\"", p.name,
                 "\") does not fit it; use one optimizer per model");
  return s;
}
template <class T>
auto AdamW<T>::slice_of(std::size_t index, std::string const& name, std::size_t n, int dp_size, int dp_rank) -> slice& {
  if (index == slices_.size()) {
    slice s;
    if (options_.zero1) {
      s.start = chunk_offset(n, static_cast<std::size_t>(dp_size), static_cast<std::size_t>(dp_rank));
      s.count = chunk_size(n, static_cast<std::size_t>(dp_size), static_cast<std::size_t>(dp_rank));
    } else {
      s.count = n;
    }
    s.weight_decay = options_.weight_decay;
    s.learning_rate = options_.learning_rate;
    for (auto const& group : options_.groups)
      if (group.matches && group.matches(name)) {
        s.weight_decay = group.weight_decay;
        s.learning_rate = group.learning_rate.value_or(options_.learning_rate);
        break;
      }
    s.m.assign(s.count, T(0));
    s.v.assign(s.count, T(0));
    if (options_.zero1 && dp_size > 1) s.grad.resize(static_cast<Eigen::Index>(s.count));  // only ZeRO-1 uses it
    slices_.push_back(std::move(s));
  }
  return slices_[index];
}

}  // namespace shardwise

// With SHARDWISE_SEPARATE_KERNELS defined, AdamW's working members and the gradients' finishing (nn/walk.hpp) for
// float and double are declared here and compiled once, by the file that includes
// <shardwise/compile_kernels.hpp> (docs/build-time.md).
#define SHARDWISE_DETAIL_OPTIMIZER(prefix, T)                                          \
  prefix template class AdamW<T>;                                                      \
  prefix template void detail::exact_square_roots<T>(T*, std::size_t);                 \
  prefix template T detail::sum_of_squares<T>(T const*, std::size_t);                  \
  prefix template void detail::sum_over_copies<T>(detail::listed_parameter<T> const&); \
  prefix template void detail::finish_gradient<T>(detail::listed_parameter<T> const&);
#if defined(SHARDWISE_SEPARATE_KERNELS) && !defined(SHARDWISE_DETAIL_COMPILING_KERNELS)
namespace shardwise {
SHARDWISE_DETAIL_OPTIMIZER(extern, float)
SHARDWISE_DETAIL_OPTIMIZER(extern, double)
}  // namespace shardwise
#endif
