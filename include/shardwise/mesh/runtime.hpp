#pragma once
// A communicator whose backend — threads or MPI — is chosen when the program starts. sw::launch hands one to the
// user's function, so that function, the model and its plan are compiled once instead of once per backend.
// Each call goes to the chosen backend's own communicator and algorithms; the choice costs one branch per
// collective. The MPI side is reached through detail::runtime_mpi, defined in mesh/mpi/runtime.hpp.
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/mesh/pending.hpp"
#include "shardwise/mesh/thread/comm.hpp"

namespace shardwise {

class RuntimeComm;
class MpiComm;

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
  template <class E, class Output>
  static void all_to_all_rows(comm const& c, E const* data, call_record const& call, std::size_t const* rows_to,
                              std::size_t* received, Output&& output, collective_site const& site);
  template <class V>
  static auto gather_values(comm const& c, V const& mine, call_record const& call);
};

/// The MPI side of a RuntimeComm (Mpi: MpiComm). Its definitions are in mesh/mpi/runtime.hpp, which includes
/// MPI's headers: runtime.hpp includes it too, unless SHARDWISE_SEPARATE_RUNTIME says that the program's
/// shardwise::separate_runtime compiled them once, so that a file that launches parses no MPI header at all.
template <class Mpi>
struct runtime_mpi {
  using handle = std::shared_ptr<Mpi const>;  ///< How a RuntimeComm holds its MpiComm.
  /// Where a received message goes: where(context, shape, bytes) gives the address.
  using receiver = void* (*)(void* context, extents const& shape, std::size_t bytes);

  static handle world(int& argc, char**& argv);
  static void tell_peers(char const* message);
  static int rank(Mpi const& c);
  static int size(Mpi const& c);
  static std::string_view label(Mpi const& c);
  static std::uint64_t next_call_number(Mpi const& c);
  static void set_timeout(Mpi const& c, timeout_duration limit);
  static timeout_duration timeout(Mpi const& c);
  static void barrier(Mpi const& c, char const* what);
  static handle split(Mpi const& c, int color, int key, std::string_view label);
  static void send_bytes(Mpi const& c, void const* data, std::size_t bytes, extents const& shape, int destination,
                         int tag);
  static void post_bytes(Mpi const& c, void const* data, std::size_t bytes, extents const& shape, int destination,
                         int tag);
  static void finish_sends(Mpi const& c);
  static void recv_into(Mpi const& c, int source, int tag, receiver where, void* context);
  static std::vector<unsigned char> gather_value_bytes(Mpi const& c, void const* mine, std::size_t bytes,
                                                       call_record const& call);

  template <class E>
  static void all_reduce(Mpi const& c, E* data, call_record const& call, collective_site const& site);
  template <class E>
  static void all_gather(Mpi const& c, E const* data, call_record const& call, storage_order order,
                         output_ref<E> output, collective_site const& site);
  template <class E>
  static pending_collective all_gather_start(Mpi const& c, E const* data, call_record const& call, storage_order order,
                                             output_ref<E> output, collective_site const& site);
  template <class E>
  static void reduce_scatter(Mpi const& c, E const* data, call_record const& call, storage_order order,
                             output_ref<E> output, collective_site const& site);
  template <class E>
  static void broadcast(Mpi const& c, E* data, call_record const& call, output_ref<E> output,
                        collective_site const& site);
  template <class E>
  static void all_to_all(Mpi const& c, E const* data, call_record const& call, storage_order order,
                         output_ref<E> output, collective_site const& site);
  template <class E>
  static void all_to_all_rows(Mpi const& c, E const* data, call_record const& call, std::size_t const* rows_to,
                              std::size_t* received, output_ref<E> output, collective_site const& site);
};
using mpi_side = runtime_mpi<MpiComm>;

/// Whether MPI transfers elements of type E (mesh/mpi/datatype.hpp): the types RuntimeComm's MPI side is compiled
/// for (16-bit ones are Eigen::bfloat16 and Eigen::half, moved as bits).
template <class E>
inline constexpr bool mpi_transfers =
    std::is_same_v<E, float> || std::is_same_v<E, double> || std::is_same_v<E, std::int8_t> ||
    std::is_same_v<E, std::uint8_t> || std::is_same_v<E, std::int16_t> || std::is_same_v<E, std::uint16_t> ||
    std::is_same_v<E, std::int32_t> || std::is_same_v<E, std::uint32_t> || std::is_same_v<E, std::int64_t> ||
    std::is_same_v<E, std::uint64_t> || sizeof(E) == 2;

template <class E>
constexpr void check_mpi_transfers() {
  static_assert(mpi_transfers<E>,
                "shardwise::MpiComm: no MPI datatype for this element type; use float, double, Eigen::bfloat16, "
                "Eigen::half or a fixed-width integer");
}

}  // namespace detail

/// The world sw::launch passes: an MpiComm under mpiexec, a ThreadComm otherwise, behind one type. It is a
/// communicator like either (build meshes on it, split it, count it); `on_mpi()` tells which one it is.
class RuntimeComm {
 public:
  using collectives = detail::runtime_collectives;  ///< The chosen backend's collectives.

  explicit RuntimeComm(ThreadComm threads) : backend_(std::move(threads)) {}  ///< Ranks as threads.
  /// Ranks as MPI processes (include <shardwise/mesh/mpi/comm.hpp> to make an MpiComm).
  template <std::same_as<MpiComm> Mpi>
  explicit RuntimeComm(Mpi mpi) : backend_(std::make_shared<Mpi const>(std::move(mpi))) {}
  /// Ranks as MPI processes, the MpiComm already held (what sw::launch passes under mpiexec).
  explicit RuntimeComm(detail::mpi_side::handle mpi) : backend_(std::move(mpi)) {}

  /// Calls fn with the backend's communicator (ThreadComm const& or MpiComm const&; a file that names the MPI
  /// side in fn must include <shardwise/mesh/mpi/comm.hpp>).
  template <class Fn>
  decltype(auto) visit(Fn&& fn) const {
    if (ThreadComm const* t = threads()) return std::forward<Fn>(fn)(*t);
    return std::forward<Fn>(fn)(mpi());
  }
  /// Whether the ranks are MPI processes (otherwise they are threads of this process).
  [[nodiscard]] bool on_mpi() const { return backend_.index() == 1; }
  /// The thread backend, or null under MPI.
  [[nodiscard]] ThreadComm const* threads() const { return std::get_if<ThreadComm>(&backend_); }
  /// The MPI backend (on_mpi() must hold).
  [[nodiscard]] MpiComm const& mpi() const { return *std::get<1>(backend_); }

  /// This rank in the group.
  [[nodiscard]] int rank() const { return threads() ? threads()->rank() : detail::mpi_side::rank(mpi()); }
  /// The number of ranks.
  [[nodiscard]] int size() const { return threads() ? threads()->size() : detail::mpi_side::size(mpi()); }
  /// The group's name, for errors.
  [[nodiscard]] std::string_view label() const {
    return threads() ? threads()->label() : detail::mpi_side::label(mpi());
  }
  /// As the backend's.
  [[nodiscard]] std::uint64_t next_call_number() const {
    return threads() ? threads()->next_call_number() : detail::mpi_side::next_call_number(mpi());
  }
  /// As the backend's.
  void set_timeout(timeout_duration limit) const {
    threads() ? threads()->set_timeout(limit) : detail::mpi_side::set_timeout(mpi(), limit);
  }
  /// As the backend's.
  [[nodiscard]] timeout_duration timeout() const {
    return threads() ? threads()->timeout() : detail::mpi_side::timeout(mpi());
  }
  /// As the backend's.
  void barrier(char const* what = "barrier") const {
    threads() ? threads()->barrier(what) : detail::mpi_side::barrier(mpi(), what);
  }
  /// The backend's split, behind the same type.
  [[nodiscard]] RuntimeComm split(int color, int key, std::string_view label) const {
    if (ThreadComm const* t = threads()) return RuntimeComm(t->split(color, key, label));
    return RuntimeComm(detail::mpi_side::split(mpi(), color, key, label));
  }

  /// As the backend's blocking send.
  void send_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const {
    threads() ? threads()->send_bytes(data, bytes, shape, destination, tag)
              : detail::mpi_side::send_bytes(mpi(), data, bytes, shape, destination, tag);
  }
  /// A send that does not wait for its receive: MPI's buffered send; the threads' send, which never waits.
  void post_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const {
    threads() ? threads()->send_bytes(data, bytes, shape, destination, tag)
              : detail::mpi_side::post_bytes(mpi(), data, bytes, shape, destination, tag);
  }
  /// Waits for the sends post_bytes left in flight (nothing to wait for on threads).
  void finish_sends() const {
    if (on_mpi()) detail::mpi_side::finish_sends(mpi());
  }
  /// As the backend's: receives the message into where(shape, byte_count).
  template <class Where>
  void recv_into(int source, int tag, Where&& where) const {
    if (ThreadComm const* t = threads()) return t->recv_into(source, tag, where);
    auto const receive = [](void* context, extents const& shape, std::size_t bytes) -> void* {
      return (*static_cast<std::remove_reference_t<Where>*>(context))(shape, bytes);
    };
    detail::mpi_side::recv_into(mpi(), source, tag, receive, const_cast<void*>(static_cast<void const*>(&where)));
  }
  /// As the backend's: hands the message to take(shape, bytes) (write take as a generic lambda).
  template <class Take>
  void recv_bytes(int source, int tag, Take&& take) const {
    if (ThreadComm const* t = threads()) return t->recv_bytes(source, tag, take);
    detail::receive_staged(*this, source, tag, take);
  }

 private:
  std::variant<ThreadComm, detail::mpi_side::handle> backend_;
};

namespace detail {

template <class E>
void runtime_collectives::all_reduce(comm const& c, E* data, call_record const& call, collective_site const& site) {
  check_mpi_transfers<E>();
  if (ThreadComm const* t = c.threads()) return ThreadComm::collectives::all_reduce(*t, data, call, site);
  mpi_side::all_reduce<E>(c.mpi(), data, call, site);
}
template <class E, class Output>
void runtime_collectives::all_gather(comm const& c, E const* data, call_record const& call, storage_order order,
                                     Output&& output, collective_site const& site) {
  check_mpi_transfers<E>();
  if (ThreadComm const* t = c.threads())
    return ThreadComm::collectives::all_gather(*t, data, call, order, output, site);
  mpi_side::all_gather<E>(c.mpi(), data, call, order, output, site);
}
template <class E, class Output>
pending_collective runtime_collectives::all_gather_start(comm const& c, E const* data, call_record const& call,
                                                         storage_order order, Output&& output,
                                                         collective_site const& site) {
  check_mpi_transfers<E>();
  if (ThreadComm const* t = c.threads())
    return start_all_gather<ThreadComm::collectives>(*t, data, call, order, output, site);
  return mpi_side::all_gather_start<E>(c.mpi(), data, call, order, output, site);
}
template <class E, class Output>
void runtime_collectives::reduce_scatter(comm const& c, E const* data, call_record const& call, storage_order order,
                                         Output&& output, collective_site const& site) {
  check_mpi_transfers<E>();
  if (ThreadComm const* t = c.threads())
    return ThreadComm::collectives::reduce_scatter(*t, data, call, order, output, site);
  mpi_side::reduce_scatter<E>(c.mpi(), data, call, order, output, site);
}
template <class E, class Output>
void runtime_collectives::broadcast(comm const& c, E* data, call_record const& call, Output&& output,
                                    collective_site const& site) {
  check_mpi_transfers<E>();
  if (ThreadComm const* t = c.threads()) return ThreadComm::collectives::broadcast(*t, data, call, output, site);
  mpi_side::broadcast<E>(c.mpi(), data, call, output, site);
}
template <class E, class Output>
void runtime_collectives::all_to_all(comm const& c, E const* data, call_record const& call, storage_order order,
                                     Output&& output, collective_site const& site) {
  check_mpi_transfers<E>();
  if (ThreadComm const* t = c.threads())
    return ThreadComm::collectives::all_to_all(*t, data, call, order, output, site);
  mpi_side::all_to_all<E>(c.mpi(), data, call, order, output, site);
}
template <class E, class Output>
void runtime_collectives::all_to_all_rows(comm const& c, E const* data, call_record const& call,
                                          std::size_t const* rows_to, std::size_t* received, Output&& output,
                                          collective_site const& site) {
  check_mpi_transfers<E>();
  if (ThreadComm const* t = c.threads())
    return ThreadComm::collectives::all_to_all_rows(*t, data, call, rows_to, received, output, site);
  mpi_side::all_to_all_rows<E>(c.mpi(), data, call, rows_to, received, output, site);
}
template <class V>
auto runtime_collectives::gather_values(comm const& c, V const& mine, call_record const& call) {
  static_assert(std::is_trivially_copyable_v<V>,
                "shardwise::MpiComm::all_gather_value: the value is sent as bytes, so its type must be trivially "
                "copyable; gather a tensor with sw::all_gather instead");
  if (ThreadComm const* t = c.threads()) return ThreadComm::collectives::gather_values(*t, mine, call);
  std::vector<unsigned char> const bytes = mpi_side::gather_value_bytes(c.mpi(), &mine, sizeof(V), call);
  std::vector<V> values(bytes.size() / sizeof(V));
  std::memcpy(static_cast<void*>(values.data()), bytes.data(), values.size() * sizeof(V));
  return values;
}

}  // namespace detail

static_assert(communicator<RuntimeComm>);

}  // namespace shardwise

// With SHARDWISE_SEPARATE_RUNTIME defined (CMake: link shardwise::separate_runtime), the MPI side is compiled once,
// by the file that includes <shardwise/mesh/compile_runtime.hpp>, and so are both backends' collectives for float,
// double and 16-bit bits, declared here; a file that launches then parses no MPI header and compiles no backend's
// algorithms for these types (docs/build-time.md). Explicit instantiations: files with and without the macro can
// share a program.
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
      comm const&, E const*, call_record const&, storage_order, output_ref<E>&&, collective_site const&);         \
  prefix template void runtime_collectives::all_to_all_rows<E, output_ref<E>>(                                    \
      comm const&, E const*, call_record const&, std::size_t const*, std::size_t*, output_ref<E>&&,               \
      collective_site const&);
// 16-bit values gathered as bits (nn::group::all_gather_bf16: every tensor-parallel group offers it).
#define SHARDWISE_DETAIL_RUNTIME_BITS_GATHER(prefix)                                                     \
  prefix template void runtime_collectives::all_gather<std::uint16_t, output_ref<std::uint16_t>>(        \
      comm const&, std::uint16_t const*, call_record const&, storage_order, output_ref<std::uint16_t>&&, \
      collective_site const&);
// The sums of counts the library's agreements and checks take (sizes, flags).
#define SHARDWISE_DETAIL_RUNTIME_COUNT_SUMS(prefix)                                                                \
  prefix template void runtime_collectives::all_reduce<std::size_t>(comm const&, std::size_t*, call_record const&, \
                                                                    collective_site const&);                       \
  prefix template void runtime_collectives::all_reduce<int>(comm const&, int*, call_record const&,                 \
                                                            collective_site const&);
#if defined(SHARDWISE_SEPARATE_RUNTIME) && !defined(SHARDWISE_DETAIL_COMPILING_RUNTIME)
namespace shardwise::detail {
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(extern, float)
SHARDWISE_DETAIL_RUNTIME_COLLECTIVES(extern, double)
SHARDWISE_DETAIL_RUNTIME_BITS_GATHER(extern)
SHARDWISE_DETAIL_RUNTIME_COUNT_SUMS(extern)
}  // namespace shardwise::detail
#else
#include "shardwise/mesh/mpi/runtime.hpp"
#endif
