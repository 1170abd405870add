#pragma once
// Expert parallelism: a mixture of experts' experts placed over an ep mesh, each rank holding an equal, contiguous
// share of them, and tokens sent to their experts' ranks and back (sw::all_to_all_rows). sw::expert_parallelize
// hands every module with a shardwise_on_expert_parallel hook this rank's sw::expert_parallel.
#include <Eigen/Core>
#include <array>
#include <concepts>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/adapters/eigen.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"
#include "shardwise/plan/hooks.hpp"
#include "shardwise/plan/module.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise {

namespace detail {
template <std::size_t Experts, std::size_t Ranks, fixed_string Path, class Spelled = spelled_t<Path>>
struct static_experts_do_not_divide_over_ep_ranks;  // incomplete on purpose: the diagnostic names all three
}  // namespace detail

/// This rank's place on an ep mesh and the exchange of rows over it, for float and double. Built by
/// sw::expert_parallelize; modules of experts read it through their shardwise_on_expert_parallel hook.
class expert_parallel {
 public:
  /// Over `ep`, a 1-D mesh.
  template <class Mesh>
  explicit expert_parallel(Mesh const& ep) : size_(ep.size()), rank_(ep.rank()), axis_(Mesh::names[0]) {
    static_assert(Mesh::ndim == 1,
                  "shardwise::expert_parallelize: experts are placed over one mesh axis; pass mesh.axis<\"ep\">() "
                  "(or sw::submesh<\"ep\">(mesh))");
    bind<float>(ep, float_);
    bind<double>(ep, double_);
  }
  /// Over `ep`, with `replicas` (a 1-D mesh) the data-parallel ranks that hold the same experts as this one:
  /// sw::fully_shard cuts each expert over them, as torchtitan shards experts over the dp ranks ep leaves.
  template <class Mesh, class Replicas>
  expert_parallel(Mesh const& ep, Replicas const& replicas) : expert_parallel(ep) {
    static_assert(Replicas::ndim == 1,
                  "shardwise::expert_parallelize: the experts' replicas are one mesh axis; pass "
                  "sw::submesh<\"edp\">(mesh) of a mesh of \"edp\" and \"ep\"");
    replicas_ = replicas.size(), replica_ = replicas.rank(), replicas_axis_ = Replicas::names[0];
    bind_replicas<float>(replicas, float_);
    bind_replicas<double>(replicas, double_);
  }

  [[nodiscard]] int size() const { return size_; }               ///< Ranks on the ep axis.
  [[nodiscard]] int rank() const { return rank_; }               ///< This rank's place on it.
  [[nodiscard]] std::string_view axis() const { return axis_; }  ///< The axis' name, for messages.
  /// Ranks holding the same experts as this one (1 unless placed with replicas).
  [[nodiscard]] int replicas() const { return replicas_; }
  /// This rank's place among them.
  [[nodiscard]] int replica() const { return replica_; }
  /// The replicas' axis name, for messages (empty without).
  [[nodiscard]] std::string_view replicas_axis() const { return replicas_axis_; }
  /// all_gather_start over the replicas along rows: `out` (whole) from every replica's `mine`, in replica order.
  template <std::floating_point T>
  [[nodiscard]] pending_collective gather_over_replicas(Eigen::Map<nn::matrix<T>> const& mine,
                                                        Eigen::Map<nn::matrix<T>>& out) const {
    return typed<T>().gather(mine, out);
  }
  /// Sums `values` over the replicas, in place (an optimizer's expert gradients, each from its ep group's tokens).
  template <std::floating_point T>
  void sum_over_replicas(Eigen::Map<nn::vector<T>>& values) const {
    typed<T>().sum_replicas(values);
  }
  /// reduce_scatter over the replicas along rows, summing: this replica's rows of the sum of every one's `whole`.
  template <std::floating_point T>
  void sum_scatter_over_replicas(nn::matrix<T> const& whole, nn::matrix<T>& part) const {
    typed<T>().sum_scatter(whole, part);
  }
  /// The experts each rank holds of `experts`; raises, naming `where` (the module's path), unless the ep size
  /// divides them.
  [[nodiscard]] std::size_t experts_per_rank(std::size_t experts, std::string_view where) const {
    if (experts % static_cast<std::size_t>(size_) != 0)
      shardwise::raise("shardwise::expert_parallelize: the ", experts, " experts at \"", where,
                       "\" do not divide over the ", size_, " ranks of mesh axis \"", axis_,
                       "\"; each rank holds an equal share: choose an ep size that divides the experts");
    return experts / static_cast<std::size_t>(size_);
  }
  /// sw::all_to_all_rows over the ep axis: rows_to[j] of `in`'s rows, in order, to rank j; into `out` what every
  /// rank sends this one, in rank order. Returns the rows that came from each rank.
  template <std::floating_point T>
  std::vector<std::size_t> exchange(nn::matrix<T> const& in, std::span<std::size_t const> rows_to,
                                    nn::matrix<T>& out) const {
    return typed<T>().exchange(in, rows_to, out);
  }
  /// Sums `values` over the ep axis, in place (an optimizer's squares of the placed experts' gradients).
  template <std::floating_point T>
  void sum(nn::vector<T>& values) const {
    typed<T>().sum(values);
  }
  /// Marks every layer of `expert` as placed here (Parameter::placed_over), so that optimizers treat its gradients
  /// as sums over the ep ranks; a module of experts calls it on each expert it keeps.
  template <class Module>
  void place(Module& expert) const {
    detail::for_each_layer(expert, [&](auto& layer) {
      if constexpr (requires { layer.shardwise_place_over(this); }) layer.shardwise_place_over(this);
    });
  }

 private:
  template <class T>
  struct collectives {
    std::function<std::vector<std::size_t>(nn::matrix<T> const&, std::span<std::size_t const>, nn::matrix<T>&)>
        exchange;
    std::function<void(nn::vector<T>&)> sum;
    std::function<pending_collective(Eigen::Map<nn::matrix<T>> const&, Eigen::Map<nn::matrix<T>>&)> gather =
        [](Eigen::Map<nn::matrix<T>> const& mine, Eigen::Map<nn::matrix<T>>& out) {
          out = mine;  // one replica: its shard is the whole
          return pending_collective{};
        };
    std::function<void(Eigen::Map<nn::vector<T>>&)> sum_replicas = [](Eigen::Map<nn::vector<T>>&) {};
    std::function<void(nn::matrix<T> const&, nn::matrix<T>&)> sum_scatter = [](nn::matrix<T> const& whole,
                                                                               nn::matrix<T>& part) { part = whole; };
  };
  template <class T, class Mesh>
  static void bind(Mesh const& ep, collectives<T>& fn) {
    fn.exchange = [ep](nn::matrix<T> const& in, std::span<std::size_t const> rows_to, nn::matrix<T>& out) {
      return detail::all_to_all_rows_on(ep.comm(0), in, rows_to, out);
    };
    fn.sum = [ep](nn::vector<T>& values) { detail::all_reduce_on(ep.comm(0), values, detail::op_kind::sum); };
  }
  template <class T, class Mesh>
  static void bind_replicas(Mesh const& replicas, collectives<T>& fn) {
    fn.gather = [replicas](Eigen::Map<nn::matrix<T>> const& mine, Eigen::Map<nn::matrix<T>>& out) {
      return detail::all_gather_start_on(replicas.comm(0), mine, out, 0);
    };
    fn.sum_replicas = [replicas](Eigen::Map<nn::vector<T>>& values) {
      detail::all_reduce_on(replicas.comm(0), values, detail::op_kind::sum);
    };
    fn.sum_scatter = [replicas](nn::matrix<T> const& whole, nn::matrix<T>& part) {
      detail::reduce_scatter_on(replicas.comm(0), whole, part, 0, detail::op_kind::sum);
    };
  }
  template <class T>
  [[nodiscard]] collectives<T> const& typed() const {
    if constexpr (std::is_same_v<T, float>)
      return float_;
    else
      return double_;
  }

  int size_ = 1, rank_ = 0, replicas_ = 1, replica_ = 0;
  std::string axis_, replicas_axis_;
  collectives<float> float_;
  collectives<double> double_;
};

namespace detail {
/// Where the model's experts are placed (sw::expert_parallelize), or null if nowhere.
template <class Model>
expert_parallel const* experts_placement(Model& model) {
  expert_parallel const* placed = nullptr;
  for_each_layer(model, [&](auto& layer) {
    if constexpr (requires { layer.shardwise_placed_over(); })
      if (!placed) placed = layer.shardwise_placed_over();
  });
  return placed;
}

/// Whether some of the model's experts are placed over ep ranks.
template <class Model>
bool placed_experts_in(Model& model) {
  return experts_placement(model) != nullptr;
}

/// Refuses, for an optimizer's step over the data-parallel axis `dp` (its comm and size), on every dp rank alike,
/// experts placed over ep ranks that with their replicas are not the data-parallel ranks (each (ep rank, replica)
/// once), or under ZeRO-1.
template <class Comm>
void check_expert_placement(expert_parallel const& placed, Comm const& dp, int dp_size, bool zero1) {
  auto const places = gather_values(dp, std::array<int, 2>{placed.rank(), placed.replica()});
  bool same = placed.size() * placed.replicas() == dp_size;
  for (std::size_t a = 0; a < places.size(); ++a)
    for (std::size_t b = a + 1; b < places.size(); ++b) same = same && places[a] != places[b];
  if (!same || zero1)
    fail("shardwise::AdamW::step: experts placed over ", placed.size(), " ranks of mesh axis \"", placed.axis(),
         "\" with a data-parallel mesh of ", dp_size, zero1 ? " under ZeRO-1" : "",
         "; an expert's gradient sums every ep rank's tokens, so the ep ranks, with the replicas of their experts "
         "(sw::expert_parallelize(model, ep, replicas)), must be the data-parallel ones, and ZeRO-1 off");
}

/// Refuses, naming `what` ("generation is"), a model whose experts are placed over ep ranks: each rank holds
/// other experts, so what works on its share alone would lose, or mix up, the others.
template <class Model>
void refuse_placed_experts(Model& model, std::string_view what) {
  if (placed_experts_in(model))
    shardwise::raise("shardwise: the model's experts are placed over ep ranks (sw::expert_parallelize), whose ", what,
                     " not built yet; do it before placing its experts");
}
}  // namespace detail

namespace detail {
/// Whether the ep mesh's static size (when it has one) divides every module's static expert count: a compile error
/// names the module's path and both numbers where it does not.
template <class Model, class Mesh>
constexpr bool static_experts_divide() {
  if constexpr (Mesh::ndim == 1 && Mesh::static_sizes[0] != dynamic_size) {
    constexpr std::size_t ranks = Mesh::static_sizes[0];
    return every_node<Model>([]<class N>() {
      if constexpr (requires { N::template shardwise_experts_divide<ranks>(); })
        return N::template shardwise_experts_divide<ranks>();
      else
        return true;
    });
  } else {
    return true;
  }
}

/// Hands every module of experts this rank's placement; raises for a model with none.
template <class Model>
std::shared_ptr<expert_parallel const> place_experts(Model& model, std::shared_ptr<expert_parallel const> placed) {
  std::size_t modules = 0;
  auto on_module = [&](auto& m, auto const&) {
    if constexpr (requires { m.shardwise_on_expert_parallel(placed); })
      m.shardwise_on_expert_parallel(placed), ++modules;
  };
  auto on_layer = [](auto&, auto const&) {};
  walk_tree(model, std::string(), on_module, on_layer);
  if (modules == 0)
    shardwise::raise(
        "shardwise::expert_parallelize: no module of the model holds experts (none has a "
        "shardwise_on_expert_parallel hook); place experts of a model of experts, such as "
        "models::MoeLlama");
  return placed;
}
}  // namespace detail

/// Places the experts of every module with a shardwise_on_expert_parallel hook (models::MoeFeedForward) over the
/// ep mesh (a 1-D mesh): each keeps its rank's equal, contiguous share of its experts, named by their index in the
/// whole model, and sends each token to its experts' ranks and back. Every rank of the ep axis takes part in every
/// forward and backward, whatever its tokens. Raises on every rank, with the same words, for a model with no
/// experts or an ep size that does not divide a module's experts.
template <module Model, class Mesh>
std::shared_ptr<expert_parallel const> expert_parallelize(Model& model, Mesh const& ep) {
  static_assert(detail::static_experts_divide<Model, Mesh>(),
                "shardwise::expert_parallelize: the ep mesh's static size does not divide a module's static "
                "expert count (its path and both numbers below); each rank holds an equal share: choose an ep "
                "size that divides the experts");
  return detail::place_experts(model, std::make_shared<expert_parallel const>(ep));
}

/// As above, with `replicas` (a 1-D mesh) the data-parallel ranks that hold the same experts as this one: EP drawn
/// from data parallelism as torchtitan draws it (dp = ep x replicas: a mesh of "edp" and "ep", the experts over
/// "ep", each expert's replicas over "edp"). sw::fully_shard over the whole data-parallel axis then cuts each expert
/// over its replicas and every other parameter over all of dp.
template <module Model, class Mesh, class Replicas>
std::shared_ptr<expert_parallel const> expert_parallelize(Model& model, Mesh const& ep, Replicas const& replicas) {
  static_assert(detail::static_experts_divide<Model, Mesh>(),
                "shardwise::expert_parallelize: the ep mesh's static size does not divide a module's static "
                "expert count (its path and both numbers below); each rank holds an equal share: choose an ep "
                "size that divides the experts");
  return detail::place_experts(model, std::make_shared<expert_parallel const>(ep, replicas));
}

template <module Model>
class Lazy;

/// Places the experts of a model declared with sw::Lazy before any parameter exists: each rank then allocates, and
/// loads from a checkpoint or a save_pretrained folder, only its own share of them.
template <module Model, class Mesh>
std::shared_ptr<expert_parallel const> expert_parallelize(Lazy<Model>& lazy, Mesh const& ep) {
  return expert_parallelize(lazy.unmaterialized(), ep);
}

}  // namespace shardwise
