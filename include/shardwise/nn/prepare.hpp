#pragma once
// PrepareModuleInput / PrepareModuleOutput / PrepareModuleInputOutput held by hand: a module holds a
// sw::Prepare<T, sw::own_style<Plan>> child and passes its input (or output) through it. Modules no longer need
// it — the parent's sw::forward(child, x) / sw::backward(child, dy) applies the child's plan entry
// (nn/module_call.hpp) — but code written that way keeps working. Layouts: Replicate, Shard<0>, Shard<-1>.
#include <memory>
#include <tuple>
#include <type_traits>

#include "shardwise/nn/layer_common.hpp"
#include "shardwise/nn/module_call.hpp"
#include "shardwise/nn/redistribute.hpp"

namespace shardwise {

/// A module's own PrepareModuleInput / PrepareModuleOutput / PrepareModuleInputOutput entry, held as a child:
/// input(x) and output(y) redistribute, input_backward and output_backward take the gradients back.
template <class T, class Location = unplanned>
class Prepare {
  using Style = typename Location::style;
  using L = detail::prepare_layouts<Style>;
  static constexpr bool allowed = std::is_same_v<Style, NoParallel> || L::input || L::output;
  using style_shown = decltype(detail::style_allowed<Location, allowed>());  // before the message: see mesh.hpp
  static_assert(allowed,
                "shardwise::Prepare: a module's own plan entry must be PrepareModuleInput, "
                "PrepareModuleOutput or PrepareModuleInputOutput");

  template <class From, class To>
  static constexpr bool preparable() {
    static_assert(detail::activation_layout<From>() && detail::activation_layout<To>(),
                  "shardwise::PrepareModuleInput/Output: layouts must be Replicate, Shard<0> or Shard<-1>");
    return true;
  }

 public:
  using shardwise_location = Location;  ///< Its place in the plan: the style, its path and the whole plan.
  SHARDWISE_SAVED()
  using style = Style;  ///< The module's own plan entry (NoParallel: passes everything through).

  /// Called by sw::parallelize: keeps the tensor-parallel group to redistribute over.
  template <class Mesh>
  void shardwise_parallelize(Mesh const& mesh) {
    group_ = nn::make_group<T>(mesh);
  }

  /// The module's input in the layout the module wants.
  template <class X>
  auto input(X const& x) const {
    if constexpr (!L::input) {
      return x;
    } else {
      static_assert(detail::input_layout_matches<typename L::in, X>,
                    "shardwise::PrepareModuleInput: the module's input does not have the style's input_layouts");
      using layouts_shown [[maybe_unused]] =
          decltype(detail::show_layout_mismatch<Location::path, typename L::in, X>());
      static_assert(preparable<typename L::in, typename L::desired_in>());
      return Activation<T, typename L::desired_in>{
          detail::redistribute_activation<typename L::in, typename L::desired_in>(
              group(), nn::matrix<T>(detail::local_of<T>(x)))};
    }
  }
  /// The gradient of the module's input, back in the layout the input came in.
  template <class G>
  auto input_backward(G const& dx) const {
    if constexpr (!L::input)
      return dx;
    else
      return Activation<T, typename L::in>{
          detail::redistribute_activation<typename G::placement, typename L::in>(group(), dx.local)};
  }
  /// The module's output in the layout the style wants.
  template <class Y>
  auto output(Y const& y) const {
    if constexpr (!L::output) {
      return y;
    } else {
      static_assert(detail::input_layout_matches<typename L::out, Y>,
                    "shardwise::PrepareModuleOutput: the module's output does not have the style's output_layouts");
      using layouts_shown [[maybe_unused]] =
          decltype(detail::show_layout_mismatch<Location::path, typename L::out, Y>());
      static_assert(preparable<typename L::out, typename L::desired_out>());
      return Activation<T, typename L::desired_out>{
          detail::redistribute_activation<typename L::out, typename L::desired_out>(
              group(), nn::matrix<T>(detail::local_of<T>(y)))};
    }
  }
  /// The gradient of the module's output, back in the layout the module gave it.
  template <class G>
  auto output_backward(G const& dy) const {
    if constexpr (!L::output)
      return dy;
    else
      return Activation<T, typename L::out>{
          detail::redistribute_activation<typename G::placement, typename L::out>(group(), dy.local)};
  }

  /// The tensor-parallel group parallelize gave the layer (null before).
  [[nodiscard]] nn::group<T> const* shardwise_group() const { return group_.get(); }

  /// No parameters of its own.
  static std::tuple<> parameters() { return {}; }

 private:
  nn::group<T> const& group() const {
    if (!group_)
      detail::fail("shardwise::Prepare at \"", Location::path.view(),
                   "\": used before parallelize gave it its tensor-parallel group; call sw::parallelize(model, tp)");
    return *group_;
  }
  std::shared_ptr<nn::group<T> const> group_;
  detail::registered_layer registration_{"Prepare", Location::path.view()};
};

}  // namespace shardwise
