#pragma once
// A communicator whose backend — threads or MPI — is chosen when the program starts. sw::launch hands one to the
// user's function, so that function, the model and its plan are compiled once instead of once per backend.
// Each call goes to the chosen backend's own communicator and algorithms; the choice costs one branch per
// collective.
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <utility>
#include <variant>

#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/mesh/mpi.hpp"
#include "shardwise/mesh/pending.hpp"
#include "shardwise/mesh/thread.hpp"

namespace shardwise {

class RuntimeComm;

namespace detail {

/// The collectives of RuntimeComm: each hands its call to the chosen backend's collectives unchanged.
struct runtime_collectives {
  using comm = RuntimeComm;
  static constexpr bool transfers_in_background = true;  // MPI's do; the threads' all_gather_start finishes at once

  template <class E>
  static void all_reduce(comm const& c, E* data, call_record const& call, collective_site const& site);
  template <class E, class Output>
  static void all_gather(comm const& c, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site);
  template <class E, class Output>
  static pending_collective all_gather_start(comm const& c, E const* data, call_record const& call, storage_order order,
                                             Output&& output, collective_site const& site);
  template <class E, class Output>
  static void reduce_scatter(comm const& c, E const* data, call_record const& call, storage_order order,
                             Output&& output, collective_site const& site);
  template <class E, class Output>
  static void broadcast(comm const& c, E* data, call_record const& call, Output&& output, collective_site const& site);
  template <class E, class Output>
  static void all_to_all(comm const& c, E const* data, call_record const& call, storage_order order, Output&& output,
                         collective_site const& site);
  template <class V>
  static auto gather_values(comm const& c, V const& mine, call_record const& call);
};

/// RuntimeComm's split and barrier, as templates so that SHARDWISE_SEPARATE_RUNTIME can declare them extern (and
/// files with and without it can share a program).
template <class Comm>
Comm runtime_split(Comm const& c, int color, int key, std::string_view label);
template <class Comm>
void runtime_barrier(Comm const& c, char const* what);

}  // namespace detail

/// The world sw::launch passes: an MpiComm under mpiexec, a ThreadComm otherwise, behind one type. It is a
/// communicator like either (build meshes on it, split it, count it); `on_mpi()` tells which one it is.
class RuntimeComm {
 public:
  using collectives = detail::runtime_collectives;  ///< The chosen backend's collectives.

  explicit RuntimeComm(ThreadComm threads) : backend_(std::move(threads)) {}  ///< Ranks as threads.
  explicit RuntimeComm(MpiComm mpi) : backend_(std::move(mpi)) {}             ///< Ranks as MPI processes.

  /// Calls fn with the backend's communicator (ThreadComm const& or MpiComm const&).
  template <class Fn>
  decltype(auto) visit(Fn&& fn) const {
    return std::visit(std::forward<Fn>(fn), backend_);
  }
  /// Whether the ranks are MPI processes (otherwise they are threads of this process).
  [[nodiscard]] bool on_mpi() const { return std::holds_alternative<MpiComm>(backend_); }

  /// This rank in the group.
  [[nodiscard]] int rank() const {
    return visit([](auto const& c) { return c.rank(); });
  }
  /// The number of ranks.
  [[nodiscard]] int size() const {
    return visit([](auto const& c) { return c.size(); });
  }
  /// The group's name, for errors.
  [[nodiscard]] std::string_view label() const {
    return visit([](auto const& c) { return c.label(); });
  }
  /// As the backend's.
  [[nodiscard]] std::uint64_t next_call_number() const {
    return visit([](auto const& c) { return c.next_call_number(); });
  }
  /// As the backend's.
  void set_timeout(timeout_duration limit) const {
    visit([&](auto const& c) { c.set_timeout(limit); });
  }
  /// As the backend's.
  [[nodiscard]] timeout_duration timeout() const {
    return visit([](auto const& c) { return c.timeout(); });
  }
  /// As the backend's.
  void barrier(char const* what = "barrier") const { detail::runtime_barrier(*this, what); }
  /// The backend's split, behind the same type.
  [[nodiscard]] RuntimeComm split(int color, int key, std::string_view label) const {
    return detail::runtime_split(*this, color, key, label);
  }

  /// As the backend's blocking send.
  void send_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const {
    visit([&](auto const& c) { c.send_bytes(data, bytes, shape, destination, tag); });
  }
  /// A send that does not wait for its receive: MPI's buffered send; the threads' send, which never waits.
  void post_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const {
    visit([&](auto const& c) {
      if constexpr (requires { c.post_bytes(data, bytes, shape, destination, tag); })
        c.post_bytes(data, bytes, shape, destination, tag);
      else
        c.send_bytes(data, bytes, shape, destination, tag);
    });
  }
  /// Waits for the sends post_bytes left in flight (nothing to wait for on threads).
  void finish_sends() const {
    visit([](auto const& c) {
      if constexpr (requires { c.finish_sends(); }) c.finish_sends();
    });
  }
  /// As the backend's: receives the message into where(shape, byte_count).
  template <class Where>
  void recv_into(int source, int tag, Where&& where) const {
    visit([&](auto const& c) { c.recv_into(source, tag, where); });
  }
  /// As the backend's: hands the message to take(shape, bytes) (write take as a generic lambda).
  template <class Take>
  void recv_bytes(int source, int tag, Take&& take) const {
    visit([&](auto const& c) { c.recv_bytes(source, tag, take); });
  }

 private:
  std::variant<ThreadComm, MpiComm> backend_;
};

namespace detail {

template <class E>
void runtime_collectives::all_reduce(comm const& c, E* data, call_record const& call, collective_site const& site) {
  c.visit([&]<class B>(B const& b) { B::collectives::all_reduce(b, data, call, site); });
}
template <class E, class Output>
void runtime_collectives::all_gather(comm const& c, E const* data, call_record const& call, storage_order order,
                                     Output&& output, collective_site const& site) {
  c.visit([&]<class B>(B const& b) { B::collectives::all_gather(b, data, call, order, output, site); });
}
template <class E, class Output>
pending_collective runtime_collectives::all_gather_start(comm const& c, E const* data, call_record const& call,
                                                         storage_order order, Output&& output,
                                                         collective_site const& site) {
  return c.visit([&]<class B>(B const& b) {
    return start_all_gather<typename B::collectives>(b, data, call, order, output, site);
  });
}
template <class E, class Output>
void runtime_collectives::reduce_scatter(comm const& c, E const* data, call_record const& call, storage_order order,
                                         Output&& output, collective_site const& site) {
  c.visit([&]<class B>(B const& b) { B::collectives::reduce_scatter(b, data, call, order, output, site); });
}
template <class E, class Output>
void runtime_collectives::broadcast(comm const& c, E* data, call_record const& call, Output&& output,
                                    collective_site const& site) {
  c.visit([&]<class B>(B const& b) { B::collectives::broadcast(b, data, call, output, site); });
}
template <class E, class Output>
void runtime_collectives::all_to_all(comm const& c, E const* data, call_record const& call, storage_order order,
                                     Output&& output, collective_site const& site) {
  c.visit([&]<class B>(B const& b) { B::collectives::all_to_all(b, data, call, order, output, site); });
}
template <class Comm>
Comm runtime_split(Comm const& c, int color, int key, std::string_view label) {
  return c.visit([&](auto const& b) { return Comm(b.split(color, key, label)); });
}
template <class Comm>
void runtime_barrier(Comm const& c, char const* what) {
  c.visit([&](auto const& b) { b.barrier(what); });
}
template <class V>
auto runtime_collectives::gather_values(comm const& c, V const& mine, call_record const& call) {
  return c.visit([&]<class B>(B const& b) { return B::collectives::gather_values(b, mine, call); });
}

}  // namespace detail

static_assert(communicator<RuntimeComm>);

}  // namespace shardwise

// With SHARDWISE_SEPARATE_RUNTIME defined (CMake: link shardwise::separate_runtime), what reaches both backends'
// algorithms — split, barrier, and the collectives for float and double — is declared here and compiled once, by the
// file that includes <shardwise/mesh/compile_runtime.hpp>, instead of in every file that launches
// (docs/build-time.md). Explicit instantiations: files with and without the macro can share a program.
#define SHARDWISE_DETAIL_RUNTIME_SPLIT_AND_BARRIER(prefix)                                                \
  prefix template RuntimeComm runtime_split<RuntimeComm>(RuntimeComm const&, int, int, std::string_view); \
  prefix template void runtime_barrier<RuntimeComm>(RuntimeComm const&, char const*);
#define SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(prefix, E)                                                           \
  prefix template void runtime_collectives::all_reduce<E>(comm const&, E*, call_record const&,                    \
                                                          collective_site const&);                                \
  prefix template void runtime_collectives::all_gather<E, output_ref<E>>(                                         \
      comm const&, E const*, call_record const&, storage_order, output_ref<E>&&, collective_site const&);         \
  prefix template pending_collective runtime_collectives::all_gather_start<E, output_ref<E>>(                     \
      comm const&, E const*, call_record const&, storage_order, output_ref<E>&&, collective_site const&);         \
  prefix template void runtime_collectives::reduce_scatter<E, output_ref<E>>(                                     \
      comm const&, E const*, call_record const&, storage_order, output_ref<E>&&, collective_site const&);         \
  prefix template void runtime_collectives::broadcast<E, output_ref<E>>(comm const&, E*, call_record const&,      \
                                                                        output_ref<E>&&, collective_site const&); \
  prefix template void runtime_collectives::all_to_all<E, output_ref<E>>(                                         \
      comm const&, E const*, call_record const&, storage_order, output_ref<E>&&, collective_site const&);
// 16-bit values gathered as bits (nn::group::all_gather_bf16: every tensor-parallel group offers it).
#define SHARDWISE_DETAIL_RUNTIME_BITS_GATHER(prefix)                                                     \
  prefix template void runtime_collectives::all_gather<std::uint16_t, output_ref<std::uint16_t>>(        \
      comm const&, std::uint16_t const*, call_record const&, storage_order, output_ref<std::uint16_t>&&, \
      collective_site const&);
#if defined(SHARDWISE_SEPARATE_RUNTIME) && !defined(SHARDWISE_DETAIL_COMPILING_RUNTIME)
namespace shardwise::detail {
SHARDWISE_DETAIL_RUNTIME_SPLIT_AND_BARRIER(extern)
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(extern, float)
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(extern, double)
SHARDWISE_DETAIL_RUNTIME_BITS_GATHER(extern)
}  // namespace shardwise::detail
#endif
