#pragma once
// A device mesh: ranks arranged in named axes (like torch's DeviceMesh, ranks laid out row-major, the last
// axis fastest), with one communicator per axis. Axis names live in the type, so a wrong name is a compile error.
#include <array>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>

#include "shardwise/core/error.hpp"
#include "shardwise/core/fixed_string.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/mesh/timeout.hpp"

namespace shardwise {

/// A size known only at run time.
inline constexpr std::size_t dynamic_size = 0;

/// A mesh axis: its name and, when known at compile time, its size.
template <fixed_string Name, std::size_t Size = dynamic_size>
struct axis {
  static constexpr auto name = Name;                ///< The axis' name.
  static constexpr std::size_t static_size = Size;  ///< Its size, or dynamic_size when known only at run time.
};

/// What a mesh backend's communicator provides (SerialComm, ThreadComm, MpiComm).
template <class C>
concept communicator = std::copy_constructible<C> && requires(C const& c) {
  { c.rank() } -> std::convertible_to<int>;
  { c.size() } -> std::convertible_to<int>;
  { c.label() } -> std::convertible_to<std::string_view>;
  { c.split(0, 0, std::string_view{}) } -> std::same_as<C>;
  typename C::collectives;  // the backend's collective algorithms
  { c.next_call_number() } -> std::convertible_to<std::uint64_t>;
  c.set_timeout(timeout_duration{});
  c.barrier();
};

namespace detail {
struct from_axis_comm {};
template <fixed_string Name, class Spelled = spelled_t<Name>>
struct unknown_mesh_axis;  // incomplete on purpose: the diagnostic spells the name
template <fixed_string Name, class Spelled = spelled_t<Name>>
struct mesh_axis_named_twice;

template <fixed_string Name, class... Axes>
constexpr std::size_t count_axis() {
  return (std::size_t{0} + ... + (Axes::name.view() == Name.view() ? 1 : 0));
}

// The show functions (this one, and their kin in plan.hpp, module.hpp and nn/) are named in decltype before the
// static_assert with the library's message, because clang reports nothing after a class's first failed
// static_assert; they name the incomplete type through show_incomplete (core/show.hpp), so no function that a
// constant expression evaluates ever fails (clang 14 crashes on one that does).
template <class A, class... Axes>
constexpr auto show_if_named_twice() {
  if constexpr (count_axis<A::name, Axes...>() != 1) {
    using offending_axis [[maybe_unused]] = decltype(detail::show_incomplete<mesh_axis_named_twice<A::name>>());
  }
  return true;
}
}  // namespace detail

/// A device mesh: the ranks of a communicator arranged along named axes (sw::axis), with a communicator along
/// each axis. Built by make_mesh.
template <communicator Comm, class... Axes>
class Mesh {
  static_assert(sizeof...(Axes) >= 1, "shardwise::Mesh: a mesh needs at least one named axis");

  static constexpr bool axes_named_once = ((detail::count_axis<Axes::name, Axes...>() == 1) && ...);
  using repeated_names_shown = decltype((detail::show_if_named_twice<Axes, Axes...>() && ...));
  static_assert(axes_named_once,
                "shardwise::Mesh: a mesh axis is named twice; give every axis of make_mesh a different name");

 public:
  using comm_type = Comm;                                                           ///< The communicator type.
  static constexpr std::size_t ndim = sizeof...(Axes);                              ///< The number of axes.
  static constexpr std::array<std::string_view, ndim> names{Axes::name.view()...};  ///< The axes' names.
  /// The axes' sizes declared at compile time (dynamic_size where not).
  static constexpr std::array<std::size_t, ndim> static_sizes{Axes::static_size...};

  /// Position of the axis called Name; a compile error naming it if there is none.
  template <fixed_string Name>
  static constexpr std::size_t index_of() {
    constexpr std::size_t found = detail::count_axis<Name, Axes...>();
    static_assert(found == 1,
                  "shardwise::Mesh::axis: the mesh has no axis of this name; use one of the names "
                  "given to make_mesh");
    if constexpr (found != 1) {
      using offending_name [[maybe_unused]] = decltype(detail::show_incomplete<detail::unknown_mesh_axis<Name>>());
      return 0;
    } else {
      std::size_t index = 0;
      while (names[index] != Name.view()) ++index;
      return index;
    }
  }

  /// Splits `world` into the mesh (collective on world). sizes[i] is the size of axis i.
  Mesh(Comm const& world, std::array<int, ndim> const& sizes) : world_(world), sizes_(sizes) {
    long long total = 1;
    bool beyond = false;  // the product does not fit: a wrapped one could equal the world size
    for (std::size_t i = 0; i < ndim; ++i) {
      if (sizes_[i] < 1)
        detail::fail("shardwise::make_mesh: axis \"", names[i], "\" has size ", sizes_[i],
                     "; sizes must be at least 1");
      if (static_sizes[i] != dynamic_size && static_cast<std::size_t>(sizes_[i]) != static_sizes[i])
        detail::fail("shardwise::make_mesh: axis \"", names[i], "\" is declared with size ", static_sizes[i],
                     " but was given ", sizes_[i]);
      beyond = beyond || __builtin_mul_overflow(total, static_cast<long long>(sizes_[i]), &total);
    }
    if (beyond || total != world.size())
      detail::fail("shardwise::make_mesh: the mesh has ", beyond ? "more than 2^63" : std::to_string(total), " ranks (",
                   describe_sizes(), ") but the world has ", world.size(),
                   "; choose axis sizes whose product is the world size");
    int rest = world.rank();
    for (std::size_t i = ndim; i-- > 0;) {
      coords_[i] = rest % sizes_[i];
      rest /= sizes_[i];
    }
    for (std::size_t i = 0; i < ndim; ++i) {
      int color = 0;  // the coordinates on every other axis identify this axis' group
      for (std::size_t j = 0; j < ndim; ++j)
        if (j != i) color = color * sizes_[j] + coords_[j];
      axis_comms_[i] = world.split(color, coords_[i], names[i]);
    }
  }

  [[nodiscard]] int size() const { return world_.size(); }  ///< The number of ranks in the mesh.
  [[nodiscard]] int rank() const { return world_.rank(); }  ///< This rank in the whole mesh.
  /// The size of axis `axis_index`.
  [[nodiscard]] int size(std::size_t axis_index) const { return sizes_[axis_index]; }
  /// This rank's coordinate along axis `axis_index`.
  [[nodiscard]] int coordinate(std::size_t axis_index) const { return coords_[axis_index]; }
  [[nodiscard]] std::array<int, ndim> const& sizes() const { return sizes_; }  ///< Every axis' size.
  /// This rank's coordinate along every axis.
  [[nodiscard]] std::array<int, ndim> const& coordinates() const { return coords_; }
  /// The size of the axis called Name.
  template <fixed_string Name>
  [[nodiscard]] int size() const {
    return sizes_[index_of<Name>()];
  }
  /// This rank's coordinate along the axis called Name.
  template <fixed_string Name>
  [[nodiscard]] int coordinate() const {
    return coords_[index_of<Name>()];
  }

  /// The communicator along axis `axis_index`.
  [[nodiscard]] Comm const& comm(std::size_t axis_index) const { return *axis_comms_[axis_index]; }
  /// The communicator spanning the whole mesh.
  [[nodiscard]] Comm const& world() const { return world_; }

  /// How long a rank waits for its peers in a collective on this mesh (any axis, and the world) before it
  /// raises, naming the ranks that did not arrive. Call it on every rank; SHARDWISE_TIMEOUT (seconds) sets the
  /// default, which is 30 minutes.
  void set_timeout(timeout_duration limit) const {
    world_.set_timeout(limit);
    for (auto const& c : axis_comms_) c->set_timeout(limit);
  }

  /// The 1-D mesh of the ranks that share this rank's coordinates on every other axis.
  template <fixed_string Name>
  [[nodiscard]] auto axis() const {
    if constexpr (detail::count_axis<Name, Axes...>() == 1) {
      constexpr std::size_t i = index_of<Name>();
      using Axis = std::tuple_element_t<i, std::tuple<Axes...>>;
      return Mesh<Comm, Axis>(detail::from_axis_comm{}, comm(i), coords_[i]);
    } else {
      return index_of<Name>();  // index_of's error names the axis (and clang 14 stops there instead of crashing)
    }
  }

 private:
  template <communicator, class...>
  friend class Mesh;

  // A 1-D mesh over an existing axis communicator: no split needed.
  Mesh(detail::from_axis_comm, Comm const& axis_comm, int coordinate)
      : world_(axis_comm), sizes_{axis_comm.size()}, coords_{coordinate} {
    axis_comms_[0] = axis_comm;
  }

  std::string describe_sizes() const {
    std::string text;
    for (std::size_t i = 0; i < ndim; ++i)
      text += (i ? " x " : "") + std::string(names[i]) + "=" + std::to_string(sizes_[i]);
    return text;
  }

  Comm world_;
  std::array<int, ndim> sizes_{};
  std::array<int, ndim> coords_{};
  std::array<std::optional<Comm>, ndim> axis_comms_{};
};

/// make_mesh<"dp", "tp">(world, {2, 2}): axes with sizes given at run time.
template <fixed_string... Names, communicator Comm>
[[nodiscard]] auto make_mesh(Comm const& world, std::array<int, sizeof...(Names)> const& sizes) {
  return Mesh<Comm, axis<Names>...>(world, sizes);
}

/// make_mesh<axis<"dp", 2>, axis<"tp", 2>>(world): sizes fixed at compile time.
template <class... Axes, communicator Comm>
  requires(sizeof...(Axes) > 0 && ((Axes::static_size != dynamic_size) && ...))
[[nodiscard]] auto make_mesh(Comm const& world) {
  return Mesh<Comm, Axes...>(world, {static_cast<int>(Axes::static_size)...});
}

/// The parts of the mesh concept, named so a failed check says which is missing.
template <class M>
concept mesh_types = requires {
  typename M::comm_type;
  { M::ndim } -> std::convertible_to<std::size_t>;
  { M::names };
};
template <class M>
concept mesh_members = requires(M const& m, std::size_t i) {
  { m.size() } -> std::convertible_to<int>;
  { m.rank() } -> std::convertible_to<int>;
  { m.size(i) } -> std::convertible_to<int>;
  { m.coordinate(i) } -> std::convertible_to<int>;
  { m.comm(i) } -> std::convertible_to<typename M::comm_type const&>;
  { m.world() } -> std::convertible_to<typename M::comm_type const&>;
};
template <class M>
concept device_mesh = mesh_types<M> && mesh_members<M>;

}  // namespace shardwise

namespace shardwise {

// Free-function spellings of the named-axis members: in generic code (a lambda taking `auto& world`) they
// spare the reader `mesh.template axis<"tp">()`.

/// The 1-D mesh of axis Name: the ranks that share this rank's coordinates on every other axis.
template <fixed_string Name, device_mesh Mesh>
[[nodiscard]] auto submesh(Mesh const& mesh) {
  return mesh.template axis<Name>();
}
/// This rank's coordinate on axis Name.
template <fixed_string Name, device_mesh Mesh>
[[nodiscard]] int coordinate(Mesh const& mesh) {
  return mesh.template coordinate<Name>();
}
/// The number of ranks along axis Name.
template <fixed_string Name, device_mesh Mesh>
[[nodiscard]] int axis_size(Mesh const& mesh) {
  return mesh.template size<Name>();
}

}  // namespace shardwise
