#pragma once
// Expert parallelism: a mixture of experts' experts placed over an ep mesh, each rank holding an equal, contiguous
// share of them, and tokens sent to their experts' ranks and back (sw::all_to_all_rows). sw::expert_parallelize
// hands every module with a shardwise_on_expert_parallel hook this rank's sw::expert_parallel.
#include <Eigen/Core>
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

  [[nodiscard]] int size() const { return size_; }               ///< Ranks on the ep axis.
  [[nodiscard]] int rank() const { return rank_; }               ///< This rank's place on it.
  [[nodiscard]] std::string_view axis() const { return axis_; }  ///< The axis' name, for messages.
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
  };
  template <class T, class Mesh>
  static void bind(Mesh const& ep, collectives<T>& fn) {
    fn.exchange = [ep](nn::matrix<T> const& in, std::span<std::size_t const> rows_to, nn::matrix<T>& out) {
      return detail::all_to_all_rows_on(ep.comm(0), in, rows_to, out);
    };
    fn.sum = [ep](nn::vector<T>& values) { detail::all_reduce_on(ep.comm(0), values, detail::op_kind::sum); };
  }
  template <class T>
  [[nodiscard]] collectives<T> const& typed() const {
    if constexpr (std::is_same_v<T, float>)
      return float_;
    else
      return double_;
  }

  int size_ = 1, rank_ = 0;
  std::string axis_;
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

/// Refuses, naming `what` ("generation is"), a model whose experts are placed over ep ranks: each rank holds
/// other experts, so what works on its share alone would lose, or mix up, the others.
template <class Model>
void refuse_placed_experts(Model& model, std::string_view what) {
  if (placed_experts_in(model))
    shardwise::raise("shardwise: the model's experts are placed over ep ranks (sw::expert_parallelize), whose ", what,
                     " not built yet; do it before placing its experts");
}
}  // namespace detail

/// Places the experts of every module with a shardwise_on_expert_parallel hook (models::MoeFeedForward) over the
/// ep mesh (a 1-D mesh): each keeps its rank's equal, contiguous share of its experts, named by their index in the
/// whole model, and sends each token to its experts' ranks and back. Every rank of the ep axis takes part in every
/// forward and backward, whatever its tokens. Raises on every rank, with the same words, for a model with no
/// experts or an ep size that does not divide a module's experts.
template <module Model, class Mesh>
std::shared_ptr<expert_parallel const> expert_parallelize(Model& model, Mesh const& ep) {
  if constexpr (Mesh::ndim == 1 && Mesh::static_sizes[0] != dynamic_size) {  // known now: checked now
    constexpr std::size_t ranks = Mesh::static_sizes[0];
    constexpr bool divide = detail::every_node<Model>([]<class N>() {
      if constexpr (requires { N::template shardwise_experts_divide<ranks>(); })
        return N::template shardwise_experts_divide<ranks>();
      else
        return true;
    });
    static_assert(divide,
                  "shardwise::expert_parallelize: the ep mesh's static size does not divide a module's static "
                  "expert count (its path and both numbers below); each rank holds an equal share: choose an ep "
                  "size that divides the experts");
  }
  auto placed = std::make_shared<expert_parallel const>(ep);
  std::size_t modules = 0;
  auto on_module = [&](auto& m, auto const&) {
    if constexpr (requires { m.shardwise_on_expert_parallel(placed); })
      m.shardwise_on_expert_parallel(placed), ++modules;
  };
  auto on_layer = [](auto&, auto const&) {};
  detail::walk_tree(model, std::string(), on_module, on_layer);
  if (modules == 0)
    shardwise::raise(
        "shardwise::expert_parallelize: no module of the model holds experts (none has a "
        "shardwise_on_expert_parallel hook); place experts of a model of experts, such as "
        "models::MoeLlama");
  return placed;
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
