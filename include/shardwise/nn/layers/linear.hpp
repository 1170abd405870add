#pragma once
// Linear: y = x W^T + b with W of shape [out, in] (PyTorch's layout), forward and backward, unsharded or under
// any style that says how it cuts the weight and moves activations (nn/layers/linear_style.hpp): ColwiseParallel,
// RowwiseParallel or one of the user's. The layer never asks which style it has; it moves its input to what its
// product reads and the product's result to the output layout, with the style's mover, and backward runs the
// conjugate moves: replicate <-> all-reduce, all-gather <-> reduce-scatter. Its code depends on its element
// type and style only (linear_core): the layers of every path and every plan that share a style share
// it; the path, for messages, is a string it keeps. The typed Linear on top adds the checks that name the path
// at compile time.
#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <type_traits>

#include "shardwise/nn/layers/linear_core.hpp"
#include "shardwise/nn/layers/styles.hpp"

namespace shardwise {

namespace detail {

/// The core a Linear under Style derives from; a style that is not a linear_style gets the unsharded one, so that
/// the Linear's own check is the error the user reads.
template <class T, class Style>
using linear_core_for =
    linear_core<T, std::conditional_t<linear_style<linear_style_t<Style>>, linear_style_t<Style>, unsharded_linear>>;

}  // namespace detail

/// A Linear at a place in the plan (Location: its style, path and the entries around it; sw::layer_at<Plan, "w1">).
/// StaticIn / StaticOut (optional): sizes known at compile time, so that with a tp axis of static size
/// (sw::axis<"tp", 4>) a size the tp size does not divide is a compile error rather than a run-time one.
template <class T, class Location = unplanned, std::size_t StaticIn = dynamic_size,
          std::size_t StaticOut = dynamic_size>
class Linear : public detail::linear_core_for<T, typename Location::style> {
  using core = detail::linear_core_for<T, typename Location::style>;
  using Style = typename Location::style;
  using style_shown = decltype(detail::style_allowed<Location, linear_style<detail::linear_style_t<Style>>>());
  static_assert(linear_style<detail::linear_style_t<Style>>,
                "shardwise::Linear: this style cannot shard a Linear; use ColwiseParallel, RowwiseParallel, or leave "
                "the layer out of the plan");
  static_assert(detail::linear_layouts_allowed<Style>);  // a library style's own rules, with their messages

 public:
  using shardwise_location = Location;                   ///< Its place in the plan (style, path, entries around it).
  using shardwise_core = detail::core_of<Linear, core>;  ///< The class that holds its parameters.
  using style = Style;                                   ///< The parallel style the plan gives it.
  using typename core::input_layout;
  using typename core::matrix;
  using typename core::output_layout;

  /// Parameters drawn like torch.nn.Linear's (uniform, bound 1/sqrt(in)) from `seed` (an integer, or the
  /// module's sw::init: inside sw::Lazy the layer records its sizes and allocates nothing).
  constexpr Linear(std::size_t in, std::size_t out, init seed, bool with_bias = true)
      : core(Location::path.view(), in, out, seed, with_bias) {
    detail::require_static_size(Location::path.view(), "input features", StaticIn, in);
    detail::require_static_size(Location::path.view(), "output features", StaticOut, out);
  }

  /// The same, from its shape (shape.copies is parallelize's to make: a Linear is built with one copy).
  constexpr Linear(linear_shape const& shape, init seed) : Linear(shape.in, shape.out, seed, shape.bias) {}

  /// Called by parallelize when the tp size is static: the sizes this style cuts must divide.
  template <std::size_t Ranks>
  static constexpr bool shardwise_static_check() {
    constexpr std::size_t cut = core::cut_rows ? StaticOut : core::cut_cols ? StaticIn : dynamic_size;
    constexpr bool ok = cut == dynamic_size || cut % Ranks == 0;
    static_assert(ok,
                  "shardwise::Linear: the features this style cuts do not divide over the tp size; choose sizes "
                  "the tp size divides");
    constexpr bool named = static_divides<Location::path, cut, Ranks>();  // spells path and sizes
    return ok && named;
  }

  /// Forward. x is a typed Activation (its layout is checked against the style at compile time) or a plain
  /// matrix (taken to be in the style's input layout).
  template <class X>
  constexpr Activation<T, output_layout> operator()(X const& x) {
    check_input_type<X>();
    decltype(auto) local = detail::local_of<T>(x);
    if constexpr (std::is_same_v<std::remove_cvref_t<decltype(local)>, matrix>) {
      return this->forward_given(local);
    } else {  // another library's tensor, seen through a map: one copy, which the layer then keeps or moves
      matrix taken(local);
      return this->forward_taken(taken);
    }
  }

  /// As above, on an input given as a temporary (an Activation or a row-major matrix of T): where the layer keeps
  /// its input as given (for backward), it takes the storage instead of copying it, and leaves the input empty.
  template <class X>
    requires(!std::is_lvalue_reference_v<X> &&
             (std::is_same_v<X, matrix> || (detail::is_activation_v<X> && std::is_same_v<typename X::element_type, T>)))
  constexpr Activation<T, output_layout> operator()(X&& x) {
    check_input_type<X>();
    if constexpr (detail::is_activation_v<X>)
      return this->forward_taken(x.local);
    else
      return this->forward_taken(x);
  }

 private:
  /// The compile-time checks of a forward's input type.
  template <class X>
  static constexpr void check_input_type() {
    using Input = std::remove_cvref_t<X>;
    static_assert(detail::layer_input_v<T, Input>,
                  "shardwise::Linear: the input must be a shardwise::Activation or a row-major [tokens, features] "
                  "tensor of the layer's element type (Eigen row-major matrix, xt::xtensor<T, 2>)");
    constexpr bool matches = detail::input_layout_matches<input_layout, Input>;
    static_assert(matches || detail::module_entry_above<Location>,
                  "shardwise::Linear: the input's layout is not the one this layer's style expects; add "
                  "PrepareModuleInput, set the style's input_layouts, or follow a ColwiseParallel with a "
                  "RowwiseParallel");
    static_assert(matches || !detail::module_entry_above<Location>,
                  "shardwise::Linear: the input's layout is not the one this layer's style expects, and the plan "
                  "has an entry (PrepareModuleInput or the like) for a module around this layer: call that module "
                  "through sw::forward(module, x) and sw::backward(module, dy), which apply its entry; "
                  "module.forward(x) skips it");
    using layouts_shown [[maybe_unused]] =
        decltype(detail::show_layout_mismatch<Location::path, input_layout, Input>());
  }
};

}  // namespace shardwise

// With SHARDWISE_SEPARATE_KERNELS defined, the cores of the library's own Linear styles (unsharded, and the
// layouts its models' plans use) for float and double are declared here and compiled once, by the file that
// includes <shardwise/compile_kernels.hpp>: a plan's first sharded Linear then costs its file no second
// compile of them (docs/build-time.md). A style of one's own, or other layouts, compile where they are used, as before.
#define SHARDWISE_DETAIL_LINEAR_CORES(prefix, T)                                          \
  SHARDWISE_DETAIL_CORE(prefix, T, linear_core<T, unsharded_linear>)                      \
  SHARDWISE_DETAIL_CORE(prefix, T, linear_core<T, ColwiseParallel<Replicate, Shard<-1>>>) \
  SHARDWISE_DETAIL_CORE(prefix, T, linear_core<T, ColwiseParallel<Shard<0>, Shard<-1>>>)  \
  SHARDWISE_DETAIL_CORE(prefix, T, linear_core<T, ColwiseParallel<Replicate, Replicate>>) \
  SHARDWISE_DETAIL_CORE(prefix, T, linear_core<T, RowwiseParallel<Shard<-1>, Replicate>>) \
  SHARDWISE_DETAIL_CORE(prefix, T, linear_core<T, RowwiseParallel<Shard<-1>, Shard<0>>>)
#if defined(SHARDWISE_SEPARATE_KERNELS) && !defined(SHARDWISE_DETAIL_COMPILING_KERNELS)
namespace shardwise::detail {
SHARDWISE_DETAIL_LINEAR_CORES(extern, float)
SHARDWISE_DETAIL_LINEAR_CORES(extern, double)
}  // namespace shardwise::detail
#endif
