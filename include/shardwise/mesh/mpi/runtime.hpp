#pragma once
// The MPI side of sw::RuntimeComm (detail::runtime_mpi, declared in mesh/runtime.hpp): each member hands its call
// to MpiComm. mesh/runtime.hpp includes this file unless SHARDWISE_SEPARATE_RUNTIME is defined; then
// mesh/compile_runtime.hpp compiles it once for the program, for every element type MPI transfers.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/mesh/mpi/comm.hpp"
#include "shardwise/mesh/runtime.hpp"

namespace shardwise::detail {

template <class Mpi>
auto runtime_mpi<Mpi>::world(int& argc, char**& argv) -> handle {
  return std::make_shared<Mpi const>(mpi_world(argc, argv));
}
template <class Mpi>
void runtime_mpi<Mpi>::tell_peers(char const* message) {
  mpi_tell_peers(message);
}
template <class Mpi>
int runtime_mpi<Mpi>::rank(Mpi const& c) {
  return c.rank();
}
template <class Mpi>
int runtime_mpi<Mpi>::size(Mpi const& c) {
  return c.size();
}
template <class Mpi>
std::string_view runtime_mpi<Mpi>::label(Mpi const& c) {
  return c.label();
}
template <class Mpi>
std::uint64_t runtime_mpi<Mpi>::next_call_number(Mpi const& c) {
  return c.next_call_number();
}
template <class Mpi>
void runtime_mpi<Mpi>::set_timeout(Mpi const& c, timeout_duration limit) {
  c.set_timeout(limit);
}
template <class Mpi>
timeout_duration runtime_mpi<Mpi>::timeout(Mpi const& c) {
  return c.timeout();
}
template <class Mpi>
void runtime_mpi<Mpi>::barrier(Mpi const& c, char const* what) {
  c.barrier(what);
}
template <class Mpi>
auto runtime_mpi<Mpi>::split(Mpi const& c, int color, int key, std::string_view label) -> handle {
  return std::make_shared<Mpi const>(c.split(color, key, label));
}
template <class Mpi>
void runtime_mpi<Mpi>::send_bytes(Mpi const& c, void const* data, std::size_t bytes, extents const& shape,
                                  int destination, int tag) {
  c.send_bytes(data, bytes, shape, destination, tag);
}
template <class Mpi>
void runtime_mpi<Mpi>::post_bytes(Mpi const& c, void const* data, std::size_t bytes, extents const& shape,
                                  int destination, int tag) {
  c.post_bytes(data, bytes, shape, destination, tag);
}
template <class Mpi>
void runtime_mpi<Mpi>::finish_sends(Mpi const& c) {
  c.finish_sends();
}
template <class Mpi>
void runtime_mpi<Mpi>::recv_into(Mpi const& c, int source, int tag, receiver where, void* context) {
  c.recv_into(source, tag, [&](extents const& shape, std::size_t bytes) { return where(context, shape, bytes); });
}
template <class Mpi>
std::vector<unsigned char> runtime_mpi<Mpi>::gather_value_bytes(Mpi const& c, void const* mine, std::size_t bytes,
                                                                call_record const& call) {
  Mpi::collectives::agree(c, call);  // records first, alone, as MpiComm's gather_values
  return c.all_gather_bytes(mine, bytes);
}

template <class Mpi>
template <class E>
void runtime_mpi<Mpi>::all_reduce(Mpi const& c, E* data, call_record const& call, collective_site const& site) {
  Mpi::collectives::all_reduce(c, data, call, site);
}
template <class Mpi>
template <class E>
void runtime_mpi<Mpi>::all_gather(Mpi const& c, E const* data, call_record const& call, storage_order order,
                                  output_ref<E> output, collective_site const& site) {
  Mpi::collectives::all_gather(c, data, call, order, output, site);
}
template <class Mpi>
template <class E>
pending_collective runtime_mpi<Mpi>::all_gather_start(Mpi const& c, E const* data, call_record const& call,
                                                      storage_order order, output_ref<E> output,
                                                      collective_site const& site) {
  return start_all_gather<typename Mpi::collectives>(c, data, call, order, std::move(output), site);
}
template <class Mpi>
template <class E>
void runtime_mpi<Mpi>::reduce_scatter(Mpi const& c, E const* data, call_record const& call, storage_order order,
                                      output_ref<E> output, collective_site const& site) {
  Mpi::collectives::reduce_scatter(c, data, call, order, output, site);
}
template <class Mpi>
template <class E>
void runtime_mpi<Mpi>::broadcast(Mpi const& c, E* data, call_record const& call, output_ref<E> output,
                                 collective_site const& site) {
  Mpi::collectives::broadcast(c, data, call, output, site);
}
template <class Mpi>
template <class E>
void runtime_mpi<Mpi>::all_to_all(Mpi const& c, E const* data, call_record const& call, storage_order order,
                                  output_ref<E> output, collective_site const& site) {
  Mpi::collectives::all_to_all(c, data, call, order, output, site);
}
template <class Mpi>
template <class E>
void runtime_mpi<Mpi>::all_to_all_rows(Mpi const& c, E const* data, call_record const& call, std::size_t const* rows_to,
                                       std::size_t* received, output_ref<E> output, collective_site const& site) {
  Mpi::collectives::all_to_all_rows(c, data, call, rows_to, received, output, site);
}

}  // namespace shardwise::detail

// The MPI side's collectives for element type E, explicitly instantiated (mesh/compile_runtime.hpp), for every
// type MPI transfers (mesh/mpi/datatype.hpp).
#define SHARDWISE_DETAIL_RUNTIME_MPI_COLLECTIVES(E)                                                                  \
  template void runtime_mpi<MpiComm>::all_reduce<E>(MpiComm const&, E*, call_record const&, collective_site const&); \
  template void runtime_mpi<MpiComm>::all_gather<E>(MpiComm const&, E const*, call_record const&, storage_order,     \
                                                    output_ref<E>, collective_site const&);                          \
  template pending_collective runtime_mpi<MpiComm>::all_gather_start<E>(                                             \
      MpiComm const&, E const*, call_record const&, storage_order, output_ref<E>, collective_site const&);           \
  template void runtime_mpi<MpiComm>::reduce_scatter<E>(MpiComm const&, E const*, call_record const&, storage_order, \
                                                        output_ref<E>, collective_site const&);                      \
  template void runtime_mpi<MpiComm>::broadcast<E>(MpiComm const&, E*, call_record const&, output_ref<E>,            \
                                                   collective_site const&);                                          \
  template void runtime_mpi<MpiComm>::all_to_all<E>(MpiComm const&, E const*, call_record const&, storage_order,     \
                                                    output_ref<E>, collective_site const&);                          \
  template void runtime_mpi<MpiComm>::all_to_all_rows<E>(MpiComm const&, E const*, call_record const&,               \
                                                         std::size_t const*, std::size_t*, output_ref<E>,            \
                                                         collective_site const&);
