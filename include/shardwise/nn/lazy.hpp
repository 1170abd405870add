#pragma once
// Lazy models: declared without allocating any parameter, parallelized (each layer records only the shape of
// this rank's shard), then materialized — allocated as this rank's shard alone — and filled from a checkpoint.
// A model too large for one process's memory is never whole anywhere. Until it is materialized the model is
// reachable only through sw::Lazy, which has no forward: using it is a compile error; a layer reached another
// way refuses at run time with the same words.
#include <type_traits>
#include <utility>

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
/// Sets the lazy flag for the layers a model's constructor builds, and clears it even if that throws.
class lazy_scope {
 public:
  lazy_scope() : previous_(constructing_lazily()) { constructing_lazily() = true; }
  ~lazy_scope() { end(); }
  lazy_scope(lazy_scope const&) = delete;
  lazy_scope& operator=(lazy_scope const&) = delete;
  void end() {
    if (active_) constructing_lazily() = previous_;
    active_ = false;
  }

 private:
  bool previous_;
  bool active_ = true;
};

template <class...>
inline constexpr bool lazy_use_refused = false;
}  // namespace detail

/// A model declared without its parameters: `sw::Lazy<Model> lazy(config)`, then `sw::parallelize(lazy, tp)`,
/// then fill it (a checkpoint loader, or sw::materialize) to get the Model& to train or run.
template <module Model>
class Lazy : private detail::lazy_scope {  // the base is built first: the flag is up while Model is built
 public:
  /// Builds Model(args...) with no parameter allocated.
  template <class... Args>
  explicit Lazy(Args&&... args) : model_(std::forward<Args>(args)...) {
    end();
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
