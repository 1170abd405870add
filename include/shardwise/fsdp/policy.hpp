#pragma once
// FSDP as types: the sharding strategy and the wrap policy that cuts the model into units, checked against the
// model's tree at compile time where the facts are static. A unit is a set of parameters gathered together: a
// module called through sw::forward / sw::backward (each element of a repeated child is a unit of its own), plus
// the root unit, which holds every parameter no other unit holds.
#include <Eigen/Core>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include "shardwise/core/fixed_string.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

/// FULL_SHARD (ZeRO-3, FSDP2's reshard_after_forward=True): parameters, gradients and optimizer state sharded;
/// a unit's parameters are gathered before its forward, freed after it, gathered again for its backward.
struct full_shard {};
/// SHARD_GRAD_OP (ZeRO-2, reshard_after_forward=False): as full_shard, but a unit stays gathered from its
/// forward to the end of its backward (one gather per step instead of two).
struct shard_grad_op {};
/// NO_SHARD (DDP): parameters replicated, gradients all-reduced (averaged) after each unit's backward.
struct no_shard {};

/// Units by plan path: each module whose path is one of Paths ("layers.*": every block, as torchtitan wraps).
template <fixed_string... Paths>
struct wrap_paths {};
/// Units by module type: each module of one of the types (Accelerate's transformer_cls_names_to_wrap).
template <class... Modules>
struct wrap_type {};
/// Units by size at run time (Accelerate's size_based_auto_wrap_policy): children first, a module becomes a
/// unit when the parameters under it that no unit holds yet number at least fsdp_options::min_num_params
/// (counted whole, as Accelerate counts them: a tensor-parallel shard counts as the tensor it is cut from).
struct wrap_min_params {};
/// No units but the root: the whole model gathered at once.
struct wrap_none {};

/// Mixed precision (FSDP2's MixedPrecisionPolicy): the fp32 (the model's element type) shards stay the
/// optimizer's master copy; a unit's parameters are gathered as Param — rounded to nearest even from the shard,
/// so the all-gather moves Param's bytes — and widened into the model's tensors, so the model computes on the
/// Param-rounded values (in its own element type: activations are not rounded); each rank's gradient is
/// rounded to Reduce for the reduce-scatter (and reduced in Reduce, in rank order, as every backend reduces
/// Reduce) and widened into the fp32 gradient shard. Param and Reduce: float, double, Eigen::bfloat16 or
/// Eigen::half; torchtitan's default is mixed_precision<Eigen::bfloat16, float>.
template <class Param, class Reduce = Param>
struct mixed_precision {
  using param_type = Param;    ///< The gathered parameters' type.
  using reduce_type = Reduce;  ///< The gradient reduce-scatter's type.
};
/// No mixed precision: parameters gathered and gradients reduced in the model's element type.
struct full_precision {};

/// An FSDP policy: the strategy (full_shard, shard_grad_op, no_shard), the wrap policy (wrap_paths,
/// wrap_type, wrap_min_params, wrap_none), the precision (full_precision, mixed_precision<...>) and, for
/// sw::fully_shard on a mesh of several axes, the axis FSDP shards over and the one tensor parallelism uses. Hybrid
/// sharding is chosen by the meshes given.
template <class Strategy = full_shard, class Wrap = wrap_none, class Precision = full_precision,
          fixed_string DataAxis = "dp", fixed_string TensorAxis = "tp">
struct fsdp_policy {
  using strategy = Strategy;                       ///< How parameters and gradients are kept.
  using wrap = Wrap;                               ///< Which modules are units.
  using precision = Precision;                     ///< full_precision or mixed_precision<Param, Reduce>.
  static constexpr auto data_axis = DataAxis;      ///< The mesh axis the parameters are sharded over.
  static constexpr auto tensor_axis = TensorAxis;  ///< The mesh axis the plan cuts layers over.
};

/// Settings of sw::fully_shard known at run time.
struct fsdp_options {
  std::size_t min_num_params = 100'000'000;  ///< wrap_min_params: the smallest unit (Accelerate's default 1e8).
  /// Accelerate's sync_module_states: every parameter is broadcast from dp rank 0 (and, hybrid, from replica 0)
  /// before it is sharded, so ranks that built or loaded different values start from rank 0's.
  bool sync_module_states = false;
  /// Accelerate's forward_prefetch: when a unit's forward starts, the all-gather of the unit that ran after it
  /// in the previous forward (on the first step, the unit made after it: model order, but wrap_min_params makes
  /// children first, so its first step may prefetch a unit that has run) starts too, so on MPI it moves while this unit
  /// computes. Two units are gathered at once instead of one.
  bool forward_prefetch = false;
  /// Accelerate's backward_prefetch = BACKWARD_PRE: when a unit's backward starts, the all-gather of the unit
  /// whose backward comes next starts too.
  bool backward_prefetch = false;
};

namespace detail {

template <class S>
inline constexpr bool is_fsdp_strategy =
    std::is_same_v<S, full_shard> || std::is_same_v<S, shard_grad_op> || std::is_same_v<S, no_shard>;
/// A strategy's name, as the error of ranks that shard by different strategies spells it.
template <class S>
inline constexpr std::string_view fsdp_strategy_name = std::is_same_v<S, full_shard>      ? "full_shard"
                                                       : std::is_same_v<S, shard_grad_op> ? "shard_grad_op"
                                                                                          : "no_shard";

template <class Type>
struct mixed_precision_type_is_not_floating;  // incomplete on purpose: the diagnostic names the type
template <fixed_string Axis, class Spelled = spelled_t<Axis>>
struct fsdp_and_tensor_parallelism_on_one_axis;  // incomplete on purpose: the diagnostic spells the axis
template <fixed_string Path, class Spelled = spelled_t<Path>>
struct wrap_path_matches_no_module;  // incomplete on purpose: the diagnostic spells the path
template <fixed_string Outer, fixed_string Inner, class Spelled = spelled_t<Inner>>
struct parameters_in_two_units;
template <class Module>
struct wrap_type_matches_no_module;
template <class Outer, class Inner>
struct wrap_types_nest;

/// Whether a module of Model has the plan path `path` ("layers.*" for each element of a repeated child).
template <class Model>
constexpr bool has_module_at(std::string_view path) {
  return any_node<Model>([path]<class N>() {
    if constexpr (module<N> && !layer<N>) {
      constexpr found_path own = module_path<N>();
      return own.found && own.path == path;
    } else {
      return false;
    }
  });
}

/// Whether `inner` is `outer` or lies under it: a parameter under both would belong to two units.
constexpr bool path_within(std::string_view outer, std::string_view inner) {
  return inner == outer ||
         (inner.size() > outer.size() && inner.substr(0, outer.size()) == outer && inner[outer.size()] == '.');
}

template <fixed_string P, fixed_string Other>
constexpr bool show_if_within() {
  if constexpr (P.view() != Other.view() && path_within(P.view(), Other.view())) {
    using shown [[maybe_unused]] = decltype(show_incomplete<parameters_in_two_units<P, Other>>());
    return false;
  } else {
    return true;
  }
}

template <fixed_string P, fixed_string... Others>
constexpr bool show_if_nested() {
  constexpr bool repeated = ((P.view() == Others.view() ? 1 : 0) + ... + 0) != 1;
  if constexpr (repeated) {
    using shown [[maybe_unused]] = decltype(show_incomplete<parameters_in_two_units<P, P>>());
  }
  return (show_if_within<P, Others>() && ...) && !repeated;
}

template <class Model, fixed_string P>
constexpr bool show_if_no_module() {
  if constexpr (!has_module_at<Model>(P.view())) {
    using shown [[maybe_unused]] = decltype(show_incomplete<wrap_path_matches_no_module<P>>());
    return false;
  } else {
    return true;
  }
}

template <class Model, class Wrap>
struct wrap_check {
  static_assert(std::is_same_v<Wrap, wrap_none> || std::is_same_v<Wrap, wrap_min_params>,
                "shardwise::fully_shard: the wrap policy must be wrap_paths<...>, wrap_type<...>, wrap_min_params or "
                "wrap_none");
  static constexpr bool ok = true;
};

template <class Model, fixed_string... Paths>
struct wrap_check<Model, wrap_paths<Paths...>> {
  static constexpr bool all_found = (show_if_no_module<Model, Paths>() && ...);
  static_assert(all_found,
                "shardwise::fully_shard: a wrap path matches no module of the model; check its spelling against the "
                "plan paths (\"layers.*\" for each element of a repeated child), and wrap modules, not single layers");
  static constexpr bool disjoint = (show_if_nested<Paths, Paths...>() && ...);
  static_assert(disjoint,
                "shardwise::fully_shard: two wrap paths put a parameter in two units (one path is the other or lies "
                "under it); keep only one of them");
  static constexpr bool ok = all_found && disjoint;
};

template <class M, class Other>
constexpr bool show_if_type_within() {
  if constexpr (!std::is_same_v<M, Other> && any_node<M>([]<class N>() { return std::is_same_v<N, Other>; })) {
    using shown [[maybe_unused]] = decltype(show_incomplete<wrap_types_nest<M, Other>>());
    return false;
  } else {
    return true;
  }
}

template <class Model, class M, class... Others>
constexpr bool show_if_type_bad() {
  constexpr bool found = any_node<Model>([]<class N>() { return std::is_same_v<N, M>; });
  if constexpr (!found) {
    using shown [[maybe_unused]] = decltype(show_incomplete<wrap_type_matches_no_module<M>>());
    return false;
  } else {
    return (show_if_type_within<M, Others>() && ...);
  }
}

template <class Model, class... Modules>
struct wrap_check<Model, wrap_type<Modules...>> {
  static_assert(((module<Modules> && !layer<Modules>) && ...),
                "shardwise::fully_shard: wrap_type names a type that is not a module (a layer, or no model part); "
                "wrap the modules that hold layers");
  static constexpr bool ok = (show_if_type_bad<Model, Modules, Modules...>() && ...);
  static_assert(ok,
                "shardwise::fully_shard: a wrap type matches no module of the model, or holds another wrap type (a "
                "parameter in two units); name the module types the model has, none inside another");
};

template <class T>
inline constexpr bool fsdp_floating = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                      std::is_same_v<T, Eigen::bfloat16> || std::is_same_v<T, Eigen::half>;

template <class T>
constexpr bool show_if_not_floating() {
  if constexpr (!fsdp_floating<T>) {
    using shown [[maybe_unused]] = decltype(show_incomplete<mixed_precision_type_is_not_floating<T>>());
  }
  return fsdp_floating<T>;
}

/// The element types a unit is gathered and reduced in, for the model's element type Scalar.
template <class Precision, class Scalar>
struct precision_types {
  using param = Scalar;
  using reduce = Scalar;
};
template <class Param, class Reduce, class Scalar>
struct precision_types<mixed_precision<Param, Reduce>, Scalar> {
  static constexpr bool floating = show_if_not_floating<Param>() && show_if_not_floating<Reduce>();
  using param = std::conditional_t<floating, Param, Scalar>;  // only the assertion below reports a bad type
  using reduce = std::conditional_t<floating, Reduce, Scalar>;
  static_assert(floating,
                "shardwise::mixed_precision: Param and Reduce must be floating types (float, double, "
                "Eigen::bfloat16, Eigen::half); name one of them");
};

/// Whether every module of type M is a unit under the wrap policy (wrap_min_params decides at run time).
template <class Wrap, class M>
struct wraps : std::false_type {};
template <fixed_string... Paths, class M>
struct wraps<wrap_paths<Paths...>, M> {
  static constexpr bool value = [] {
    if constexpr (module<M> && !layer<M>) {
      constexpr found_path own = module_path<M>();
      return own.found && ((own.path == Paths.view()) || ...);
    } else {
      return false;
    }
  }();
};
template <class... Modules, class M>
struct wraps<wrap_type<Modules...>, M> : std::bool_constant<(std::is_same_v<M, Modules> || ...)> {};

}  // namespace detail
}  // namespace shardwise
