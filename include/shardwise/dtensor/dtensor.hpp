#pragma once
// A distributed tensor: this rank's shard, the global shape, and the layout (one placement per mesh axis) in
// the type. Moving between layouts picks its collectives at compile time (layout/redistribute_plan.hpp).
#include <array>
#include <cstddef>
#include <cstring>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/layout/redistribute_plan.hpp"
#include "shardwise/layout/redistribute_steps.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/concept.hpp"

namespace shardwise {

namespace detail {

template <int D>
struct shard_dimension_out_of_range;  // incomplete on purpose: the diagnostic shows D
template <std::size_t LayoutSize, std::size_t MeshAxes>
struct layout_size_for_mesh;

/// Checks a layout against a mesh and a tensor type; true when usable.
template <class Tensor, class Mesh, class L>
constexpr bool check_layout() {
  static_assert(layout<L>,
                "shardwise::DTensor: the layout must be shardwise::Layout<P...> with placements "
                "Shard<D>, Replicate or Partial<Sum|Avg|Max|Min>");
  if constexpr (layout<L>) {
    constexpr bool sizes_match = L::size == Mesh::ndim;
    static_assert(sizes_match,
                  "shardwise::DTensor: the layout needs one placement per mesh axis; give Layout<...> "
                  "exactly as many placements as the mesh has axes");
    if constexpr (!sizes_match) {
      using placements_vs_axes [[maybe_unused]] =
          decltype(detail::show_incomplete<layout_size_for_mesh<L::size, Mesh::ndim>>());
      return false;
    } else if constexpr (!tensor<Tensor>) {
      return false;  // check_tensor reports it
    } else if constexpr (rank_v<Tensor> != dynamic_rank) {
      constexpr auto values = layout_values<L>::value;
      constexpr std::size_t rank = rank_v<Tensor>;
      constexpr bool in_range = [&] {
        for (auto p : values)
          if (!dim_in_range(p, rank)) return false;
        return true;
      }();
      static_assert(in_range,
                    "shardwise::Shard<D>: D is out of range for the tensor's rank; use 0..rank-1, or "
                    "-rank..-1 to count from the last dimension");
      if constexpr (!in_range) {
        constexpr int bad = [&] {
          for (auto p : values)
            if (!dim_in_range(p, rank)) return p.dim;
          return 0;
        }();
        using offending_dim [[maybe_unused]] = decltype(detail::show_incomplete<shard_dimension_out_of_range<bad>>());
      }
      return in_range;
    } else {
      return true;
    }
  }
  return false;
}

template <std::size_t K>
placements<K> normalized_checked(placements<K> values, std::size_t rank) {
  for (auto& p : values) {
    if (!dim_in_range(p, rank))
      fail("shardwise::Shard<", p.dim, ">: dimension out of range for a tensor of rank ", rank,
           "; use 0..rank-1, or -rank..-1 to count from the last dimension");
    p = normalized(p, rank);
  }
  return values;
}

/// Raises the same error on every rank of `comm` if any rank's check failed, so no rank is left waiting.
template <class Comm>
void agree_or_fail(Comm const& comm, bool ok, char const* what, std::string const& message) {
  auto const all = gather_values(comm, static_cast<unsigned char>(ok ? 1 : 0));
  for (std::size_t q = 0; q < all.size(); ++q)
    if (!all[q]) {
      if (!ok) fail(message);
      fail("shardwise::", what, ": rank ", q, " of the mesh rejected its shard (see that rank's error)");
    }
}

template <class... P>
Layout<P...> layout_of_placements(P...);

template <std::size_t K>
auto replicated_layout() {
  return []<std::size_t... I>(std::index_sequence<I...>) {
    return Layout<std::enable_if_t<(I < K), Replicate>...>{};
  }(std::make_index_sequence<K>{});
}

}  // namespace detail

/// A distributed tensor: this rank's shard (a Tensor), the global shape, and the layout L (one placement per
/// mesh axis) in the type. Made by distribute or from_local.
template <class Tensor, device_mesh Mesh, class L>
class DTensor {
  static_assert(detail::check_creatable_tensor<Tensor>());
  static_assert(detail::check_layout<Tensor, Mesh, L>());

 public:
  using tensor_type = Tensor;                           ///< The type of the local shard.
  using mesh_type = Mesh;                               ///< The mesh it is distributed over.
  using layout_type = L;                                ///< Its layout: one placement per mesh axis.
  using element_type = element_t<Tensor>;               ///< The element type.
  static constexpr std::size_t mesh_axes = Mesh::ndim;  ///< The number of mesh axes.

  /// Wraps a shard without checks; use from_local or distribute, which check.
  DTensor(Mesh mesh, Tensor local, extents global)
      : mesh_(std::move(mesh)), local_(std::move(local)), global_(global) {}

  [[nodiscard]] Tensor const& to_local() const& { return local_; }       ///< This rank's shard.
  [[nodiscard]] Tensor to_local() && { return std::move(local_); }       ///< This rank's shard, moved out.
  [[nodiscard]] Tensor& local() { return local_; }                       ///< This rank's shard, to change in place.
  [[nodiscard]] extents const& global_shape() const { return global_; }  ///< The whole tensor's shape.
  [[nodiscard]] Mesh const& mesh() const { return mesh_; }               ///< The mesh.

  /// The placements with negative dimensions resolved for this tensor's rank.
  [[nodiscard]] detail::placements<mesh_axes> placements() const {
    return detail::normalized_checked(detail::layout_values<L>::value, global_.rank);
  }

  /// Where this rank's shard sits in the global tensor.
  [[nodiscard]] detail::box local_box() const {
    return detail::local_box(global_, placements(), mesh_.sizes(), mesh_.coordinates());
  }

  /// The same tensor in layout To, moved with the collectives the two layouts call for.
  template <class To>
  [[nodiscard]] DTensor<Tensor, Mesh, To> redistribute() const {
    static_assert(detail::check_layout<Tensor, Mesh, To>());
    Tensor local = local_;
    auto run = [&](detail::redistribute_step const& step) {
      detail::run_redistribute_step(step, detail::comm_axis{mesh_.comm(step.axis), mesh_.coordinate(step.axis)}, local);
    };
    if constexpr (rank_v<Tensor> != dynamic_rank) {
      constexpr std::size_t rank = rank_v<Tensor>;
      constexpr auto plan = planned<To, rank>();
      static_assert(plan.valid,
                    "shardwise::redistribute: Shard to Partial is not a redistribution; a sharded "
                    "tensor is already reduced, so redistribute to Replicate or another Shard");
      for (std::size_t s = 0; s < plan.count; ++s) run(plan.steps[s]);
    } else {
      auto const plan = checked_plan<To>();
      for (std::size_t s = 0; s < plan.count; ++s) run(plan.steps[s]);
    }
    return DTensor<Tensor, Mesh, To>(mesh_, std::move(local), global_);
  }

  /// What redistribute<To>() transfers on this rank, in order, as a counting mesh (sw::counting) records it: each
  /// collective's kind, mesh axis and this rank's input bytes. The same steps as the move, costed.
  template <class To>
  [[nodiscard]] transfer_list<> redistribute_cost() const {
    static_assert(detail::check_layout<Tensor, Mesh, To>());
    std::array<std::size_t, mesh_axes> sizes{}, coords{};
    for (std::size_t i = 0; i < mesh_axes; ++i)
      sizes[i] = static_cast<std::size_t>(mesh_.size(i)), coords[i] = static_cast<std::size_t>(mesh_.coordinate(i));
    transfer_list<> list;
    detail::add_redistribute_transfers(list, checked_plan<To>(), placements(), global_, sizeof(element_type), sizes,
                                       coords, Mesh::names);
    return list;
  }

  /// The whole tensor, on every rank.
  [[nodiscard]] Tensor full_tensor() const {
    using Replicated = decltype(detail::replicated_layout<mesh_axes>());
    return redistribute<Replicated>().to_local();
  }

  /// The compile-time plan of redistribute<To>() for a tensor of static rank.
  template <class To, std::size_t Rank = rank_v<Tensor>>
  static constexpr auto planned() {
    return detail::plan_redistribute(normalized_all<L>(Rank), normalized_all<To>(Rank));
  }

 private:
  /// The steps of redistribute<To>() for this tensor's rank, made at run time; Shard to Partial refused.
  template <class To>
  detail::redistribute_plan<mesh_axes> checked_plan() const {
    auto const plan = detail::plan_redistribute(
        placements(), detail::normalized_checked(detail::layout_values<To>::value, global_.rank));
    if (!plan.valid)
      detail::fail("shardwise::redistribute: Shard to Partial on mesh axis \"", Mesh::names[plan.invalid_axis],
                   "\" is not a redistribution; a sharded tensor is already reduced, so redistribute to Replicate "
                   "or another Shard");
    return plan;
  }

  template <class Of>
  static constexpr detail::placements<mesh_axes> normalized_all(std::size_t rank) {
    auto values = detail::layout_values<Of>::value;
    for (auto& p : values) p = detail::normalized(p, rank);
    return values;
  }

  Mesh mesh_;
  Tensor local_;
  extents global_;
};

/// Cuts a tensor every rank holds in full into this rank's shard (no communication).
template <class L, device_mesh Mesh, class Tensor>
[[nodiscard]] DTensor<std::remove_cvref_t<Tensor>, Mesh, L> distribute(Mesh const& mesh, Tensor const& full) {
  using T = std::remove_cvref_t<Tensor>;
  static_assert(detail::check_creatable_tensor<T>() && detail::check_layout<T, Mesh, L>());
  extents const global = shape_of(full);
  auto const layout = detail::normalized_checked(detail::layout_values<L>::value, global.rank);
  T local = detail::copy_of_box(full, detail::local_box(global, layout, mesh.sizes(), mesh.coordinates()));
  if (detail::holds_zeros(layout, mesh.coordinates())) detail::fill_zero(local);
  return DTensor<T, Mesh, L>(mesh, std::move(local), global);
}

/// Like distribute, but only rank `root` of the mesh holds the full tensor (the others pass any tensor of the
/// type, typically empty); each rank receives just its shard, so no other rank ever holds the whole tensor.
template <class L, device_mesh Mesh, class Tensor>
[[nodiscard]] DTensor<std::remove_cvref_t<Tensor>, Mesh, L> distribute_from(Mesh const& mesh, Tensor const& full,
                                                                            int root = 0) {
  using T = std::remove_cvref_t<Tensor>;
  static_assert(detail::check_creatable_tensor<T>() && detail::check_layout<T, Mesh, L>());
  auto const& world = mesh.world();
  if (root < 0 || root >= world.size())
    detail::fail("shardwise::distribute_from: root rank ", root, " does not exist; the mesh has ranks 0 to ",
                 world.size() - 1);
  extents global = shape_of(full);
  global = detail::gather_values(world, global)[static_cast<std::size_t>(root)];
  auto const layout = detail::normalized_checked(detail::layout_values<L>::value, global.rank);
  auto coords_of = [&](int rank) {
    std::array<int, Mesh::ndim> coords{};
    for (std::size_t i = Mesh::ndim; i-- > 0;) {
      coords[i] = rank % mesh.size(i);
      rank /= mesh.size(i);
    }
    return coords;
  };
  constexpr int tag = 16000;  // apart from the small tags users pick
  if (world.rank() == root) {
    for (int r = 0; r < world.size(); ++r) {
      auto const coords = coords_of(r);
      if (r == root || detail::holds_zeros(layout, coords)) continue;
      T const piece = detail::copy_of_box(full, detail::local_box(global, layout, mesh.sizes(), coords));
      auto const shape = shape_of(piece);
      world.send_bytes(detail::traits_of<T>::data(piece), shape.elements() * sizeof(element_t<T>), shape, r, tag);
    }
  }
  auto const mine = detail::local_box(global, layout, mesh.sizes(), mesh.coordinates());
  T local = make_tensor<T>(mine.size);
  if (detail::holds_zeros(layout, mesh.coordinates())) {
    detail::fill_zero(local);
  } else if (world.rank() == root) {
    local = detail::copy_of_box(full, mine);
  } else {
    world.recv_bytes(root, tag, [&](extents const&, auto const& bytes) {
      if (!bytes.empty()) std::memcpy(data_of(local), bytes.data(), bytes.size());
    });
  }
  return DTensor<T, Mesh, L>(mesh, std::move(local), global);
}

/// Takes this rank's shard as it is, with the global shape given; checks on every rank that each shard is
/// sized as the layout says (torch.chunk sizes) and raises the same error everywhere if not.
template <class L, device_mesh Mesh, class Tensor>
[[nodiscard]] DTensor<std::remove_cvref_t<Tensor>, Mesh, L> from_local(Mesh const& mesh, Tensor&& local,
                                                                       extents const& global) {
  using T = std::remove_cvref_t<Tensor>;
  static_assert(detail::check_creatable_tensor<T>() && detail::check_layout<T, Mesh, L>());
  auto const layout = detail::normalized_checked(detail::layout_values<L>::value, global.rank);
  extents const expected = detail::local_box(global, layout, mesh.sizes(), mesh.coordinates()).size;
  extents const actual = shape_of(local);
  bool const ok = expected == actual;
  detail::agree_or_fail(
      mesh.world(), ok, "from_local",
      ok ? std::string()
         : detail::concat("shardwise::from_local: rank ", mesh.rank(), " holds a shard of shape ", actual,
                          " but the layout puts a shard of shape ", expected, " there for the global shape ", global,
                          "; shards are sized like torch.chunk"));
  return DTensor<T, Mesh, L>(mesh, T(std::forward<Tensor>(local)), global);
}

/// from_local without the global shape: it is worked out from the shards' sizes (one small collective per
/// sharded axis), then checked like the overload above.
template <class L, device_mesh Mesh, class Tensor>
[[nodiscard]] DTensor<std::remove_cvref_t<Tensor>, Mesh, L> from_local(Mesh const& mesh, Tensor&& local) {
  using T = std::remove_cvref_t<Tensor>;
  static_assert(detail::check_creatable_tensor<T>() && detail::check_layout<T, Mesh, L>());
  extents global = shape_of(local);
  auto const layout = detail::normalized_checked(detail::layout_values<L>::value, global.rank);
  for (std::size_t i = Mesh::ndim; i-- > 0;) {  // innermost cuts first: a chunk of a chunk
    if (layout[i].kind != detail::placement_kind::shard) continue;
    auto const d = static_cast<std::size_t>(layout[i].dim);
    std::size_t total = 0;
    for (auto const& e : detail::gather_values(mesh.comm(i), global)) total += e[d];
    global[d] = total;
  }
  return from_local<L>(mesh, std::forward<Tensor>(local), global);
}

/// redistribute as a free function: dt.redistribute<To>() without `.template` in generic code.
template <class To, class Tensor, class Mesh, class From>
[[nodiscard]] DTensor<Tensor, Mesh, To> redistribute(DTensor<Tensor, Mesh, From> const& dt) {
  return dt.template redistribute<To>();
}

/// redistribute_cost as a free function: what dt.redistribute<To>() transfers on this rank, as a counting mesh
/// records it.
template <class To, class Tensor, class Mesh, class From>
[[nodiscard]] transfer_list<> redistribute_cost(DTensor<Tensor, Mesh, From> const& dt) {
  return dt.template redistribute_cost<To>();
}

}  // namespace shardwise
