#pragma once
// LayerNorm and RMSNorm over the feature dimension, unsharded or under a style that keeps the activations cut
// along the sequence (SequenceParallel: each rank normalizes its own tokens, no communication). There the weight
// gradients are partial sums over each rank's tokens, and their type says so. A norm's state and code are a core
// templated on the element type and the layout only (detail::norm_core), which every path and plan that gives a
// norm the same layout shares; the typed norm on top checks its input's layout at compile time, naming the path.
#include <cstddef>
#include <memory>
#include <string_view>
#include <tuple>
#include <type_traits>

#include "shardwise/cost/cost.hpp"
#include "shardwise/nn/kernels/functional.hpp"
#include "shardwise/nn/layers/layer_common.hpp"
#include "shardwise/nn/layers/parameter.hpp"
#include "shardwise/nn/redistribute.hpp"
#include "shardwise/nn/shapes.hpp"
#include "shardwise/nn/training/deferred_weight_gradients.hpp"

namespace shardwise {

/// What a plan entry's style must say for a norm (LayerNorm, RMSNorm): the layout its activations arrive and
/// leave in, `input_layouts` = `output_layouts`, Replicate or Shard<0> (cut along the sequence: each rank
/// normalizes its own tokens, and the weight's gradient is a partial sum that sw::finish_gradients reduces). A
/// style that cuts a weight (`weight_placement`) or moves a module's input (`desired_input_layouts`) is not a
/// norm's. SequenceParallel is one; a style of one's own with these members serves as well.
template <class S>
concept norm_style =
    requires {
      typename S::input_layouts;
      typename S::output_layouts;
    } && std::is_same_v<typename S::input_layouts, typename S::output_layouts> &&
    (std::is_same_v<typename S::input_layouts, Replicate> || std::is_same_v<typename S::input_layouts, Shard<0>>) &&
    !requires { typename S::weight_placement; } && !requires { typename S::desired_input_layouts; };

namespace detail {

enum class norm_kind { layer, rms };

/// The style of a norm the plan does not name: activations and weights whole.
struct unsharded_norm {
  using input_layouts = Replicate;
  using output_layouts = Replicate;
};
template <class Style>
struct norm_style_of {
  using type = Style;
};
template <>
struct norm_style_of<NoParallel> {
  using type = unsharded_norm;
};
template <class Style>
using norm_style_t = typename norm_style_of<Style>::type;

/// The layout a norm under Style works in (Replicate for a style that is no norm's: the norm's check says so).
template <class Style>
struct norm_layout_of {
  using type = Replicate;
};
template <norm_style Style>
struct norm_layout_of<Style> {
  using type = typename Style::input_layouts;
};

/// A norm's state and code for element type T in layout Layout; the path is a run-time string, for messages.
template <class T, class Layout, norm_kind Kind>
class norm_core : public layer_plumbing<T> {
  using plumbing = layer_plumbing<T>;
  using plumbing::frozen_;
  using plumbing::group_;
  using plumbing::lazy_;
  using plumbing::path_;
  static constexpr bool sequence_parallel = std::is_same_v<Layout, Shard<0>>;
  // Cut over tp, by tokens (SequenceParallel) or by heads (HeadRMSNorm): each rank's weight gradient is partial.
  static constexpr bool partial_gradients = !std::is_same_v<Layout, Replicate>;

 public:
  SHARDWISE_SAVED(saved_input_, mean_, rstd_)
  using layout = Layout;  ///< The layout its input and output have on the tp axis.
  using input_layout = layout;
  using output_layout = layout;
  using grad_placement = std::conditional_t<partial_gradients, Partial<Sum>, Replicate>;
  using matrix = nn::matrix<T>;
  using vector = nn::vector<T>;

  /// The norm's cost (sw::cost) over `features` for s.tokens tokens: its weight (and LayerNorm's bias) on every
  /// rank and their gradients — twice under SequenceParallel, where the partial sums wait beside the finished
  /// ones — and its input with the per-token statistics kept for backward (this rank's tokens under
  /// SequenceParallel). It sends nothing itself: SequenceParallel's partial gradients are reduced by
  /// sw::finish_gradients.
  static constexpr cost shardwise_cost(std::size_t features, cost_inputs const& s = {}) {
    cost c;
    c.parameter_bytes = parameter_bytes(features);
    c.gradient_bytes = partial_gradients ? 2 * c.parameter_bytes : c.parameter_bytes;
    c.activation_bytes = activation_bytes(features, s);
    return c;
  }
  /// @{ Parts of shardwise_cost: the bytes of its parameters, and of what its forward keeps (input, statistics).
  static constexpr std::size_t parameter_bytes(std::size_t features) {
    return features * (Kind == norm_kind::layer ? 2 : 1) * sizeof(T);
  }
  static constexpr std::size_t activation_bytes(std::size_t features, cost_inputs const& s) {
    std::size_t const rows = sequence_parallel ? s.local_tokens() : s.tokens;
    return rows * (features + (Kind == norm_kind::layer ? 2 : 1)) * sizeof(T);
  }
  /// @}

  /// Its weight (and LayerNorm's bias) as the costs that walk a model's parameters see them
  /// (sw::parameter_cost): whole on every rank, their gradients Partial under SequenceParallel.
  template <class Fn>
  static constexpr void shardwise_parameter_costs(norm_shape const& shape, cost_inputs const&, Fn&& fn) {
    parameter_cost const p{shape.features, sizeof(T), partial_gradients, 0, shape.features};
    fn(p);
    if (Kind == norm_kind::layer) fn(p);
  }

  norm_core(std::string_view path, std::size_t features, T eps, init declared);

  /// @{ Copies, moves and destruction, compiled with the core's other code (once, in shardwise::separate_kernels)
  /// rather than in every file that builds a model: a model's blocks copy and move their layers through them.
  norm_core(norm_core const&);
  norm_core(norm_core&&) noexcept;
  norm_core& operator=(norm_core const&);
  norm_core& operator=(norm_core&&) noexcept;
  ~norm_core();
  /// @}

  vector weight, weight_grad, bias, bias_grad;  // bias: LayerNorm only; gradients: finished (reduced) ones

  void zero_grad();

  template <class Mesh>
  void shardwise_parallelize(Mesh const& mesh) {
    group_ = nn::make_group<T>(mesh);
  }

  /// A lazily constructed norm allocates its (replicated) parameters: zeros, to be filled from a checkpoint.
  void shardwise_materialize();

  /// Forward on this rank's [tokens, features] (the typed norm has checked the input's layout).
  Activation<T, layout> forward_local(matrix const& x);

  /// Backward; the gradient given is in the norm's layout or Partial<Sum> (reduced into it here first).
  template <class P>
  Activation<T, layout> backward(Activation<T, P> const& dy_given) {
    return backward_from(gradient_in<layout>(group_.get(), dy_given, this->kind_, path_));
  }

  /// The parameters with their gradients; under SequenceParallel the gradients are Partial until reduced
  /// (sw::reduce, sw::finish_gradients), which adds them into weight_grad and bias_grad.
  auto parameters() {
    if constexpr (Kind == norm_kind::layer)
      return std::make_tuple(parameter(weight, weight_grad, pending_weight_grad_, "weight"),
                             parameter(bias, bias_grad, pending_bias_grad_, "bias"));
    else
      return std::make_tuple(parameter(weight, weight_grad, pending_weight_grad_, "weight"));
  }

 private:
  T eps_;
  std::size_t features_;
  Parameter<vector, grad_placement> parameter(vector& value, vector& grad, vector& pending, std::string_view leaf) {
    Parameter<vector, grad_placement> p{&value, &grad, group_.get(), path_};
    if constexpr (partial_gradients) p.grad = &pending, p.reduced_into = &grad;
    p.leaf = leaf;
    p.frozen = &frozen_[leaf == "bias" ? 1 : 0];
    return p;
  }

  Activation<T, layout> backward_from(matrix const& dy_local);
  void weight_gradient(matrix const& x, matrix const& dy, vector const& mean, vector const& rstd);

  matrix saved_input_;
  vector mean_, rstd_;
  vector pending_weight_grad_, pending_bias_grad_;  // SequenceParallel: this rank's partial sums, not reduced yet
};

// The members that do the work, out of the class, so that SHARDWISE_SEPARATE_KERNELS can take the library's
// layouts' cores from shardwise::separate_kernels (see the end of this file).
// Defaulted here, not in the class: an explicit instantiation declaration (SHARDWISE_SEPARATE_KERNELS) then
// keeps them out of the files that use the core.
template <class T, class Layout, norm_kind Kind>
norm_core<T, Layout, Kind>::norm_core(norm_core const&) = default;
template <class T, class Layout, norm_kind Kind>
norm_core<T, Layout, Kind>::norm_core(norm_core&&) noexcept = default;
template <class T, class Layout, norm_kind Kind>
norm_core<T, Layout, Kind>& norm_core<T, Layout, Kind>::operator=(norm_core const&) = default;
template <class T, class Layout, norm_kind Kind>
norm_core<T, Layout, Kind>& norm_core<T, Layout, Kind>::operator=(norm_core&&) noexcept = default;
template <class T, class Layout, norm_kind Kind>
norm_core<T, Layout, Kind>::~norm_core() = default;

template <class T, class Layout, norm_kind Kind>
norm_core<T, Layout, Kind>::norm_core(std::string_view path, std::size_t features, T eps, init declared)
    : plumbing(Kind == norm_kind::layer ? "LayerNorm" : "RMSNorm", path, declared.declares_only()),
      eps_(eps),
      features_(features) {
  if (lazy_) return;  // sizes only: sw::materialize allocates
  weight = vector::Ones(static_cast<Eigen::Index>(features));
  if constexpr (Kind == norm_kind::layer) bias = vector::Zero(static_cast<Eigen::Index>(features));
  zero_grad();
}

template <class T, class Layout, norm_kind Kind>
void norm_core<T, Layout, Kind>::zero_grad() {
  weight_grad.setZero(weight.size());
  bias_grad.setZero(bias.size());
  if constexpr (partial_gradients) {
    pending_weight_grad_.setZero(weight.size());
    pending_bias_grad_.setZero(bias.size());
  }
}

template <class T, class Layout, norm_kind Kind>
void norm_core<T, Layout, Kind>::shardwise_materialize() {
  if (!lazy_) return;
  weight.setZero(static_cast<Eigen::Index>(features_));
  if constexpr (Kind == norm_kind::layer) bias.setZero(static_cast<Eigen::Index>(features_));
  lazy_ = false;
  zero_grad();
}

template <class T, class Layout, norm_kind Kind>
auto norm_core<T, Layout, Kind>::forward_local(matrix const& x) -> Activation<T, layout> {
  this->require_ready(false);  // a norm communicates nothing
  saved_input_ = x;
  Activation<T, layout> y{matrix(saved_input_.rows(), saved_input_.cols())};
  rstd_.resize(saved_input_.rows());
  if constexpr (Kind == norm_kind::layer) {
    mean_.resize(saved_input_.rows());
    nn::layer_norm_forward<T>(saved_input_, weight, bias, eps_, y.local, mean_, rstd_);
  } else {
    nn::rms_norm_forward<T>(saved_input_, weight, eps_, y.local, rstd_);
  }
  return y;
}

template <class T, class Layout, norm_kind Kind>
auto norm_core<T, Layout, Kind>::backward_from(matrix const& dy_local) -> Activation<T, layout> {
  if (dy_local.rows() != saved_input_.rows() || dy_local.cols() != saved_input_.cols())
    fail("shardwise::", this->kind_, " at \"", path_, "\": backward got a gradient of ", dy_local.rows(), "x",
         dy_local.cols(), " after a forward of ", saved_input_.rows(), "x", saved_input_.cols(),
         "; pass the gradient of this norm's last output");
  Activation<T, layout> dx{matrix(dy_local.rows(), dy_local.cols())};
  bool const frozen = frozen_[0] && (Kind != norm_kind::layer || frozen_[1]);  // sw::freeze: no weight work
  if (auto* later = this->shardwise_weight_work(); later || frozen) {          // a pipeline's B: W runs it later
    if constexpr (Kind == norm_kind::layer)
      nn::layer_norm_backward_input<T>(saved_input_, weight, dy_local, mean_, rstd_, dx.local);
    else
      nn::rms_norm_backward_input<T>(saved_input_, weight, dy_local, rstd_, dx.local);
    if (later)
      later->defer([this, x = std::move(saved_input_), dy = matrix(dy_local), mean = std::move(mean_),
                    rstd = std::move(rstd_)] { weight_gradient(x, dy, mean, rstd); });
    saved_input_ = matrix(), mean_ = vector(), rstd_ = vector();
    return dx;
  }
  // Under SequenceParallel each rank's tokens give a partial sum, kept apart until reduce() adds it in.
  vector& dweight = partial_gradients ? pending_weight_grad_ : weight_grad;
  [[maybe_unused]] vector& dbias = partial_gradients ? pending_bias_grad_ : bias_grad;
  if (dweight.size() != weight.size()) zero_grad();  // a materialized norm's first backward
  if constexpr (Kind == norm_kind::layer)
    nn::layer_norm_backward<T>(saved_input_, weight, dy_local, mean_, rstd_, dx.local, dweight, dbias);
  else
    nn::rms_norm_backward<T>(saved_input_, weight, dy_local, rstd_, dx.local, dweight);
  return dx;
}

template <class T, class Layout, norm_kind Kind>
void norm_core<T, Layout, Kind>::weight_gradient(matrix const& x, matrix const& dy, vector const& mean,
                                                 vector const& rstd) {
  vector& dweight = partial_gradients ? pending_weight_grad_ : weight_grad;
  [[maybe_unused]] vector& dbias = partial_gradients ? pending_bias_grad_ : bias_grad;
  if (dweight.size() != weight.size()) zero_grad();
  if constexpr (Kind == norm_kind::layer)
    nn::layer_norm_backward_weight<T>(x, dy, mean, rstd, dweight, dbias);
  else
    nn::rms_norm_backward_weight<T>(x, dy, rstd, dweight);
}

/// A norm at a place in the plan (Location: its style, path and the entries around it): the core of its layout, with
/// the compile-time checks that name the path.
template <class T, class Location, norm_kind Kind>
class norm_layer : public norm_core<T, typename norm_layout_of<norm_style_t<typename Location::style>>::type, Kind> {
  using core = norm_core<T, typename norm_layout_of<norm_style_t<typename Location::style>>::type, Kind>;
  using Style = typename Location::style;
  using style_shown = decltype(style_allowed<Location, norm_style<norm_style_t<Style>>>());  // see mesh.hpp
  static_assert(norm_style<norm_style_t<Style>>,
                "shardwise::LayerNorm/RMSNorm: a norm cannot be split by columns or rows; use "
                "SequenceParallel, or leave it out of the plan");

 public:
  using shardwise_location = Location;  ///< Its place in the plan (style, path, entries around it).
  using shardwise_core = detail::core_of<norm_layer, core>;  ///< The class that holds its parameters.
  using style = Style;                                       ///< The parallel style the plan gives it.
  using typename core::layout;

  /// `features` weights set to one (LayerNorm: and biases to zero). `declared`: the module's sw::init, of which
  /// only the mode counts (built inside sw::Lazy: nothing allocated until materialized or loaded).
  constexpr explicit norm_layer(std::size_t features, T eps = T(1e-5), init declared = {})
      : core(Location::path.view(), features, eps, declared) {}
  /// The same, from its shape.
  constexpr explicit norm_layer(norm_shape const& shape, T eps = T(1e-5), init declared = {})
      : norm_layer(shape.features, eps, declared) {}

  /// Forward. x is a typed Activation (its layout is checked against the style at compile time) or a plain
  /// matrix (taken to be in the style's layout).
  template <class X>
  constexpr Activation<T, layout> operator()(X const& x) {
    static_assert(
        layer_input_v<T, X>,
        "shardwise::LayerNorm/RMSNorm: the input must be a shardwise::Activation or a row-major [tokens, features] "
        "tensor of the layer's element type (Eigen row-major matrix, xt::xtensor<T, 2>)");
    constexpr bool matches = detail::input_layout_matches<layout, X>;
    static_assert(matches || detail::module_entry_above<Location>,
                  "shardwise::LayerNorm/RMSNorm: the input's layout is not the one this norm's style expects "
                  "(SequenceParallel: Shard<0>; none: Replicate); add PrepareModuleInput or change the style");
    static_assert(matches || !detail::module_entry_above<Location>,
                  "shardwise::LayerNorm/RMSNorm: the input's layout is not the one this norm's style expects, and "
                  "the plan has an entry (PrepareModuleInput or the like) for a module around this norm: call that "
                  "module through sw::forward(module, x) and sw::backward(module, dy), which apply its entry; "
                  "module.forward(x) skips it");
    using layouts_shown [[maybe_unused]] = decltype(detail::show_layout_mismatch<Location::path, layout, X>());
    return this->forward_local(local_of<T>(x));
  }
};

}  // namespace detail

/// LayerNorm over the features (GPT-2's), with a weight and a bias; unsharded or under SequenceParallel.
template <class T, class Location = unplanned>
class LayerNorm : public detail::norm_layer<T, Location, detail::norm_kind::layer> {
 public:
  using detail::norm_layer<T, Location, detail::norm_kind::layer>::norm_layer;
  /// The class that holds its parameters.
  using shardwise_core =
      detail::core_of<LayerNorm,
                      typename detail::norm_layer<T, Location, detail::norm_kind::layer>::shardwise_core::type>;
};

/// RMSNorm over the features (Llama's), with a weight; unsharded or under SequenceParallel.
template <class T, class Location = unplanned>
class RMSNorm : public detail::norm_layer<T, Location, detail::norm_kind::rms> {
 public:
  /// The class that holds its parameters.
  using shardwise_core =
      detail::core_of<RMSNorm, typename detail::norm_layer<T, Location, detail::norm_kind::rms>::shardwise_core::type>;
  /// `features` weights set to one; eps 1e-6 unless given (Llama's configs give 1e-5 or 1e-6).
  /// `declared`: the module's sw::init, of which only the mode counts (sw::Lazy: nothing allocated yet).
  constexpr explicit RMSNorm(std::size_t features, T eps = T(1e-6), init declared = {})
      : detail::norm_layer<T, Location, detail::norm_kind::rms>(features, eps, declared) {}
  /// The same, from its shape.
  constexpr explicit RMSNorm(norm_shape const& shape, T eps = T(1e-6), init declared = {})
      : RMSNorm(shape.features, eps, declared) {}
};

}  // namespace shardwise

// With SHARDWISE_SEPARATE_KERNELS defined, the norms' cores in the layouts the library's styles give them
// (whole, cut along the sequence, and a head norm's heads cut over tp) for float and double are declared here and
// compiled once, by the file that includes <shardwise/compile_kernels.hpp> (docs/build-time.md).
#define SHARDWISE_DETAIL_NORM_CORES(prefix, T)                                \
  SHARDWISE_DETAIL_CORE(prefix, T, norm_core<T, Replicate, norm_kind::layer>) \
  SHARDWISE_DETAIL_CORE(prefix, T, norm_core<T, Replicate, norm_kind::rms>)   \
  SHARDWISE_DETAIL_CORE(prefix, T, norm_core<T, Shard<0>, norm_kind::layer>)  \
  SHARDWISE_DETAIL_CORE(prefix, T, norm_core<T, Shard<0>, norm_kind::rms>)    \
  SHARDWISE_DETAIL_CORE(prefix, T, norm_core<T, Shard<1>, norm_kind::rms>)
#if defined(SHARDWISE_SEPARATE_KERNELS) && !defined(SHARDWISE_DETAIL_COMPILING_KERNELS)
namespace shardwise::detail {
SHARDWISE_DETAIL_NORM_CORES(extern, float)
SHARDWISE_DETAIL_NORM_CORES(extern, double)
}  // namespace shardwise::detail
#endif

#include "shardwise/nn/layers/norm_meta.hpp"  // the shape-only norm (element type sw::meta<T>)
