#pragma once
// Lazy models: declared without allocating any parameter, parallelized (each layer records only the shape of
// this rank's shard), then materialized — allocated as this rank's shard alone — and filled from a checkpoint.
// A model too large for one process's memory is never whole anywhere. Until it is materialized the model is
// reachable only through sw::Lazy, which has no forward: using it is a compile error; a layer reached another
// way refuses at run time with the same words.
#include <concepts>
#include <type_traits>
#include <utility>

#include "shardwise/nn/layers/init.hpp"
#include "shardwise/nn/layers/layer_common.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

/// Allocates every lazily constructed layer's shard (zeros); layers built normally are left as they are.
/// Returns the model, now usable.
template <module Model>
Model& materialize(Model& model) {
  detail::for_each_layer(model, [](auto& l) {
    if constexpr (requires { l.shardwise_materialize(); }) l.shardwise_materialize();
  });
  return model;
}

namespace detail {
/// A config-like argument whose `seed` member is a shardwise::init (models::LlamaConfig, GPT2Config).
template <class A>
concept has_init_seed = requires(A& a) { requires std::same_as<decltype(a.seed), init>; };
template <class A>
concept carries_init = std::same_as<A, init> || has_init_seed<A>;

/// The argument as sw::Lazy hands it to the model's constructor: an init, or a config's init seed, switched to
/// "declared only"; any other argument unchanged.
template <class A>
decltype(auto) declared_only(A&& a) {
  using plain = std::remove_cvref_t<A>;
  if constexpr (std::same_as<plain, init>) {
    return init::declared(a.seed());
  } else if constexpr (has_init_seed<plain>) {
    plain copy(a);
    copy.seed = init::declared(copy.seed.seed());
    return copy;
  } else {
    return std::forward<A>(a);
  }
}

/// After sw::Lazy built the model: every layer only declared, or the module that built it eagerly named.
template <module Model>
void require_declared_only(Model& model) {
  for_each_layer(model, [](auto const& l) {
    if constexpr (requires { l.layer_path(); })
      if (l.materialized())
        fail("shardwise::Lazy: the ", l.layer_kind(), " at \"", l.layer_path(),
             "\" was built with its parameters: the module that holds it gave it a plain seed. Take the seed as "
             "sw::init in the module's constructor and hand each child `seed + k` (a norm: pass it as its last "
             "argument), so that the children are only declared");
  });
}

template <class...>
inline constexpr bool lazy_use_refused = false;
}  // namespace detail

/// A model declared without its parameters: `sw::Lazy<Model> lazy(config)`, then `sw::parallelize(lazy, tp)`,
/// then fill it (a checkpoint loader, or sw::materialize) to get the Model& to train or run.
template <module Model>
class Lazy {
 public:
  /// Builds Model(args...) with no parameter allocated: the argument that is an sw::init, or a config whose
  /// `seed` is one, is handed on as "declared only", and the model's constructor passes it to its layers.
  /// Refused at compile time when no argument carries an sw::init, and at run time, naming the layer, when the
  /// model built a layer with its parameters all the same.
  template <class... Args>
  explicit Lazy(Args&&... args) : model_(detail::declared_only(std::forward<Args>(args))...) {
    static_assert((detail::carries_init<std::remove_cvref_t<Args>> || ...),
                  "shardwise::Lazy: no constructor argument carries an sw::init, so the model's layers cannot know "
                  "they are only declared; pass the seed as sw::init(seed) (or a config whose `seed` is an "
                  "sw::init, as models::LlamaConfig's) and let the model's constructor hand it to its layers");
    detail::require_declared_only(model_);
  }

  /// Not before the parameters exist: fill the model from a checkpoint or call sw::materialize(lazy) first.
  template <class... Args>
  void forward(Args&&...) {
    static_assert(detail::lazy_use_refused<Args...>,
                  "shardwise::Lazy::forward: the model's parameters are not materialized; fill it from a checkpoint "
                  "or call sw::materialize(lazy), and use the model it returns");
  }
  /// Not before the parameters exist, as forward.
  template <class... Args>
  void backward(Args&&...) {
    static_assert(detail::lazy_use_refused<Args...>,
                  "shardwise::Lazy::backward: the model's parameters are not materialized; fill it from a checkpoint "
                  "or call sw::materialize(lazy), and use the model it returns");
  }

  /// For loaders: the model whose layers know their shard shapes but hold no values yet.
  Model& unmaterialized() { return model_; }

 private:
  Model model_;
};

/// sw::forward on a lazily declared model, whose parameters do not exist yet: refused at compile time.
template <class Model, class X>
void forward(Lazy<Model>&, X const&) {
  static_assert(detail::lazy_use_refused<Model, X>,
                "shardwise::forward: the model is declared with sw::Lazy and its parameters are not materialized; "
                "call sw::forward on the model that sw::materialize(lazy) (or a load into the lazy model) returns");
}
/// sw::backward on a lazily declared model: refused, as forward.
template <class Model, class X>
void backward(Lazy<Model>&, X const&) {
  static_assert(detail::lazy_use_refused<Model, X>,
                "shardwise::backward: the model is declared with sw::Lazy and its parameters are not materialized; "
                "call sw::backward on the model that sw::materialize(lazy) (or a load into the lazy model) returns");
}

/// Lets every layer of the lazy model record its shard's shape over `tp`; nothing is allocated.
template <module Model, class Group>
Lazy<Model>& parallelize(Lazy<Model>& lazy, Group const& tp) {
  parallelize(lazy.unmaterialized(), tp);
  return lazy;
}

/// Allocates this rank's shard of every parameter (zeros) and returns the model, now usable.
template <module Model>
Model& materialize(Lazy<Model>& lazy) {
  return materialize(lazy.unmaterialized());
}

}  // namespace shardwise
