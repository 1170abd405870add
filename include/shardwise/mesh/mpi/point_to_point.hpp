#pragma once
// MpiComm's point-to-point transfers (send, post, receive), defined apart from the class so that mesh/mpi/comm.hpp
// stays readable: each message is its tensor shape, then its bytes, on tags 2t and 2t + 1, under the timeout.
#include <mpi.h>

#include <cstddef>
#include <vector>

#include "shardwise/mesh/mpi/comm.hpp"

namespace shardwise {

inline void MpiComm::send_bytes(void const* data, std::size_t bytes, extents const& shape, int destination,
                                int tag) const {
  check_peer(destination, "send");
  int const count = detail::mpi_count(bytes, "send");
  point_to_point("send",
                 "the receiving rank did not take the message: it never called recv for it, stopped, or "
                 "the network failed",
                 [&] {
                   detail::mpi_check(MPI_Send(&shape, sizeof(extents), MPI_BYTE, destination, 2 * tag, native()),
                                     "MPI_Send");
                   detail::mpi_check(MPI_Send(data, count, MPI_BYTE, destination, 2 * tag + 1, native()), "MPI_Send");
                 });
}

inline void MpiComm::post_bytes(void const* data, std::size_t bytes, extents const& shape, int destination,
                                int tag) const {
  check_peer(destination, "send");
  int const count = detail::mpi_count(bytes, "send");
  reap_finished_sends();  // else a step of m microbatches would hold a copy of every send until its end
  auto& sent = state_->posted.emplace_back();
  sent.shape = shape;
  sent.bytes.assign(static_cast<unsigned char const*>(data), static_cast<unsigned char const*>(data) + bytes);
  detail::mpi_check(
      MPI_Isend(&sent.shape, sizeof(extents), MPI_BYTE, destination, 2 * tag, native(), &sent.requests[0]),
      "MPI_Isend");
  detail::mpi_check(
      MPI_Isend(sent.bytes.data(), count, MPI_BYTE, destination, 2 * tag + 1, native(), &sent.requests[1]),
      "MPI_Isend");
}

inline void MpiComm::finish_sends() const {
  for (auto& sent : state_->posted) {
    wait_all(sent.requests, 2, "send", [&](MPI_Request*) {
      detail::fail("shardwise::send on mesh axis \"", label_, "\": rank ", rank(), " waited ",
                   detail::seconds_text(timeout()),
                   " for a peer to receive what it sent; every send needs a matching recv. Raise the limit with "
                   "SHARDWISE_TIMEOUT (seconds) or set_timeout if the receiver is just slow");
    });
  }
  state_->posted.clear();
}

inline void MpiComm::reap_finished_sends() const {
  auto& posted = state_->posted;
  while (!posted.empty()) {
    int done = 0;
    detail::mpi_check(MPI_Testall(2, posted.front().requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (!done) return;
    posted.pop_front();
  }
}

template <class Take>
void MpiComm::recv_bytes(int source, int tag, Take&& take) const {
  detail::receive_staged(*this, source, tag, take);
}

template <class Where>
void MpiComm::recv_into(int source, int tag, Where&& where) const {
  check_peer(source, "recv");
  extents shape;
  MPI_Request request;
  detail::mpi_check(MPI_Irecv(&shape, sizeof(extents), MPI_BYTE, source, 2 * tag, native(), &request), "MPI_Irecv");
  wait_all(&request, 1, "recv", [&](MPI_Request* pending) {
    abandon(pending, 1);
    detail::recv_timed_out(rank(), label_, timeout(), source, tag);
  });
  char const* const stalled = "the sender stopped or the network failed after the message's shape arrived";
  int bytes = 0;
  point_to_point("recv", stalled, [&] { bytes = probed_bytes(native(), source, 2 * tag + 1); });
  void* destination = nullptr;
  try {
    destination = where(shape, static_cast<std::size_t>(bytes));
  } catch (...) {
    point_to_point("recv", stalled, [&] { discard(native(), source, 2 * tag + 1, bytes); });
    throw;
  }
  point_to_point("recv", stalled, [&] {
    detail::mpi_check(MPI_Recv(destination, bytes, MPI_BYTE, source, 2 * tag + 1, native(), MPI_STATUS_IGNORE),
                      "MPI_Recv");
  });
}

}  // namespace shardwise
