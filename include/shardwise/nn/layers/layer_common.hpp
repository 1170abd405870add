#pragma once
// What every layer shares: its place in the plan, the group it talks to, deterministic initialisation (the
// same seed gives the same full parameters on every rank, so a sharded model starts from exactly the weights
// of the unsharded one) and the checks that name the layer's path.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <string_view>

#include "shardwise/core/error.hpp"
#include "shardwise/core/module_hooks.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/group.hpp"
#include "shardwise/nn/layers/init.hpp"
#include "shardwise/nn/layers/styles.hpp"
#include "shardwise/nn/parameter_list.hpp"
#include "shardwise/nn/training/deferred_weight_gradients.hpp"
#include "shardwise/plan/members.hpp"
#include "shardwise/plan/plan.hpp"
#include "shardwise/plan/registration.hpp"

namespace shardwise {

class expert_parallel;  // nn/experts/expert_parallel.hpp: where an expert's layers are placed

/// The location of a layer used outside any plan.
using unplanned = located<NoParallel, "">;

namespace detail {

/// Incomplete on purpose: the diagnostic shows the path and the style that cannot apply.
template <fixed_string Path, class Style, class Spelled = spelled_t<Path>>
struct style_cannot_shard_layer_at;

/// Whether the plan has a module style (PrepareModuleInput and the like) at a module around the layer (Location):
/// then a layer's input in the wrong layout most likely means the module was called as module.forward(x), which
/// skips that entry, instead of through sw::forward(module, x).
template <class Enclosing>
inline constexpr bool has_module_style = false;
template <class... Entries>
inline constexpr bool has_module_style<plan<Entries...>> = (module_style<typename Entries::style> || ... || false);
template <class Location>
inline constexpr bool module_entry_above = has_module_style<typename Location::enclosing>;

/// Named in decltype before the layer's static_assert (see mesh.hpp's show_if_named_twice).
template <class Location, bool Allowed>
constexpr auto style_allowed() {
  if constexpr (!Allowed) {
    using offending_style [[maybe_unused]] =
        decltype(detail::show_incomplete<style_cannot_shard_layer_at<Location::path, typename Location::style>>());
  }
  return Allowed;
}

/// Uniform in [-bound, bound], the same on every rank for the same seed.
template <class T, class Dense>
void fill_uniform(Dense& m, T bound, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(bound * uniform(rng));
}

/// A lazily constructed layer used before its parameters exist: refused, naming the layer and the fix.
inline void require_materialized(bool pending, char const* layer, std::string_view path) {
  if (pending)
    fail("shardwise::", layer, " at \"", path,
         "\": its parameters are not materialized (the model was declared with sw::Lazy); fill it from a "
         "checkpoint or call sw::materialize(model) first");
}

/// Sizes a style cuts must divide over the group: checked when parallelize gives the layer its group.
inline void require_divisible(std::string_view style, std::string_view path, char const* what, std::size_t size,
                              int ranks, std::string_view axis, char const* or_else = "") {
  if (size % static_cast<std::size_t>(ranks) != 0)
    fail("shardwise::", style, " at \"", path, "\": ", size, " ", what, " do not divide over ", ranks,
         " ranks of mesh axis \"", axis, "\"; choose sizes the tp size divides", or_else);
}

constexpr void require_static_size(std::string_view path, char const* what, std::size_t declared, std::size_t given) {
  if (declared != 0 && declared != given)
    fail("shardwise::Linear at \"", path, "\": declared with ", declared, " ", what, " but built with ", given);
}

/// What every shardwise layer keeps beside its parameters: its plan path (for messages), the tensor-parallel group
/// parallelize gives it, whether it was declared lazily (sw::Lazy) and has no parameters yet, and its registration
/// (how parallelize finds a layer missing from SHARDWISE_CHILDREN). Linear, Embedding and the norms derive from
/// it; it depends on the element type only, so their code need not depend on the path.
template <class T>
class layer_plumbing {
 public:
  /// The tensor-parallel group parallelize gave the layer (null before).
  [[nodiscard]] nn::group<T> const* shardwise_group() const { return group_.get(); }
  /// Whether the parameters exist (a layer declared under sw::Lazy has none until it is materialized).
  [[nodiscard]] bool materialized() const { return !lazy_; }
  /// What the layer is ("Linear") and its plan path, for messages about it.
  [[nodiscard]] std::string_view layer_kind() const { return kind_; }
  [[nodiscard]] std::string_view layer_path() const { return path_; }
  /// The hooks sw::forward and sw::backward run around the modules above this layer (null: none).
  [[nodiscard]] detail::module_hooks* shardwise_module_hooks() const { return hooks_.get(); }
  /// Set by the object that owns the hooks (fully_shard's sharded model), on every layer of its model.
  void shardwise_attach_hooks(detail::module_hooks* hooks) { hooks_.set(hooks); }
  /// Where the layer's backward records its weight-gradient work (a pipeline's B), or null: it does it now.
  [[nodiscard]] deferred_weight_gradients* shardwise_weight_work() const { return weight_work_.get(); }
  /// Set by sw::defer_weight_gradients on every layer of the module it arms (null: disarmed).
  void shardwise_defer_weight_work(deferred_weight_gradients* into) { weight_work_.set(into); }
  /// The ep placement of the expert this layer belongs to (null: none): its gradient sums every ep rank's tokens,
  /// so optimizers divide it by the ep ranks instead of averaging it over them.
  [[nodiscard]] expert_parallel const* shardwise_placed_over() const { return placed_over_; }
  /// Set by sw::expert_parallel::place on every layer of an expert it places.
  void shardwise_place_over(expert_parallel const* placed) { placed_over_ = placed; }

 protected:
  /// `path` must outlive the layer (a plan path: static storage); `declared_only`: built inside sw::Lazy.
  layer_plumbing(char const* kind, std::string_view path, bool declared_only)
      : kind_(kind), path_(path), lazy_(declared_only), registration_(kind, path) {}

  /// Refuses a layer used before it is materialized and, when its style communicates, before parallelize.
  void require_ready(bool needs_group) const {
    require_materialized(lazy_, kind_, path_);
    if (needs_group && !group_)
      fail("shardwise::", kind_, " at \"", path_,
           "\": used before parallelize gave it its tensor-parallel group; call sw::parallelize(model, tp)");
  }

  char const* kind_;
  std::string_view path_;
  bool lazy_;                        // declared under sw::Lazy and not materialized yet
  bool frozen_[2] = {false, false};  // sw::freeze: the weight [0] and the bias [1] are not trained
  std::shared_ptr<nn::group<T> const> group_;

 private:
  registered_layer registration_;
  attached_hooks hooks_;
  attached<deferred_weight_gradients> weight_work_;
  expert_parallel const* placed_over_ = nullptr;
};

/// A weight that belongs to another layer of the same model, kept as its distance from the layer that uses it
/// (as Boost.Interprocess's offset_ptr does): copying or moving the whole model keeps the tie, to the copy's own
/// owner. Both layers must therefore live in one model object (members, or members of its members).
template <class M>
class weight_tie {
 public:
  bool tied = false;
  std::string_view owner_path;

  void bind(void const* self, M& value, M& grad, std::string_view path) {
    tied = true;
    owner_path = path;
    value_offset_ = address(&value) - address(self);
    grad_offset_ = address(&grad) - address(self);
  }
  M& value(void const* self) const { return *reinterpret_cast<M*>(address(self) + value_offset_); }
  M& grad(void const* self) const { return *reinterpret_cast<M*>(address(self) + grad_offset_); }

 private:
  static std::intptr_t address(void const* p) { return reinterpret_cast<std::intptr_t>(p); }
  std::intptr_t value_offset_ = 0, grad_offset_ = 0;
};

template <class T>
nn::matrix<T> columns(nn::matrix<T> const& m, Eigen::Index start, Eigen::Index count) {
  return m.middleCols(start, count);
}

}  // namespace detail

namespace detail {
/// Incomplete on purpose: the diagnostic shows the path, the size and the tp size.
template <fixed_string Path, std::size_t Size, std::size_t Ranks, class Spelled = spelled_t<Path>>
struct size_does_not_divide_at;
}  // namespace detail

/// For a module's shardwise_static_check<Ranks>() (called by parallelize when the tp size is static): whether
/// a size known at compile time divides over Ranks (a dynamic size, 0, passes: check it at run time with
/// require_divides). When it does not, the diagnostic spells Path, Size and Ranks beside the caller's
/// static_assert message.
template <fixed_string Path, std::size_t Size, std::size_t Ranks>
constexpr bool static_divides() {
  if constexpr (Size == 0 || Ranks == 0) {  // dynamic: checked at run time
    return true;
  } else if constexpr (Size % Ranks != 0) {
    using offending_size [[maybe_unused]] =
        decltype(detail::show_incomplete<detail::size_does_not_divide_at<Path, Size, Ranks>>());
    return false;
  } else {
    return true;
  }
}

/// For a module's shardwise_on_parallelize(tp_size): raises sw::error (on every rank, as every rank runs it)
/// when `count` `what` ("heads") do not divide over `ranks`, naming the module's path and the fix.
inline void require_divides(std::string_view path, char const* what, std::size_t count, int ranks) {
  if (ranks <= 0 || count % static_cast<std::size_t>(ranks) != 0)
    detail::fail("shardwise::parallelize at \"", path, "\": ", count, " ", what, " do not divide over ", ranks,
                 " ranks; choose sizes the tp size divides");
}

/// A configuration number as text that reads back to the same double (17 significant digits), for the fields a
/// model's config saves beside its weights.
inline std::string config_number(double value) {
  std::ostringstream out;
  out.precision(17);
  out << value;
  return out.str();
}

}  // namespace shardwise

// One library layer core for shardwise::separate_kernels (prefix `extern` where it is declared, empty where it is
// compiled): the class, and its entry in a model's list (list_layer), which every model's list walk calls.
#define SHARDWISE_DETAIL_CORE(prefix, T, ...) \
  prefix template class __VA_ARGS__;          \
  prefix template void list_layer<T, __VA_ARGS__>(model_list<T>&, __VA_ARGS__&, list_path const&);
