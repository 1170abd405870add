#pragma once
// MpiComm's call agreement, defined apart from the class so that mesh/mpi/comm.hpp stays readable: every rank's call
// record, exchanged point to point under the timeout and the desync check (mesh/mpi/desync.hpp), and the
// two-rank exchange that sends a record with its data.
#include <mpi.h>

#include <optional>
#include <type_traits>
#include <vector>

#include "shardwise/mesh/mpi/comm.hpp"

namespace shardwise {

inline std::vector<detail::call_record> MpiComm::all_gather_records(detail::call_record const& mine) const {
  auto const n = static_cast<std::size_t>(size());
  std::vector<detail::call_record> all(n);
  all[static_cast<std::size_t>(rank())] = mine;
  std::vector<MPI_Request> requests;
  requests.reserve(2 * n);
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    requests.emplace_back();
    detail::mpi_check(MPI_Irecv(&all[static_cast<std::size_t>(q)], sizeof(detail::call_record), MPI_BYTE, q, 0,
                                internal(), &requests.back()),
                      "MPI_Irecv");
  }
  std::size_t const receives = requests.size();
  for (int q = 0; q < size(); ++q) {
    if (q == rank()) continue;
    requests.emplace_back();
    detail::mpi_check(MPI_Isend(&mine, sizeof(detail::call_record), MPI_BYTE, q, 0, internal(), &requests.back()),
                      "MPI_Isend");
  }
  char const* what = detail::kind_name(mine.kind).data();
  struct pending_records {
    MpiComm const* comm;
    MPI_Request* requests;
    std::size_t receives;
    /// The ranks of the axis whose records have not come. MPI_Testall changes no request until all are done.
    [[nodiscard]] std::vector<int> missing() const {
      std::vector<int> ranks;
      for (std::size_t i = 0, q = 0; i < receives; ++i, ++q) {
        if (static_cast<int>(q) == comm->rank()) ++q;
        int arrived = 0;
        MPI_Request_get_status(requests[i], &arrived, MPI_STATUS_IGNORE);
        if (!arrived) ranks.push_back(static_cast<int>(q));
      }
      return ranks;
    }
  } const records{this, requests.data(), receives};
  detail::mpi_wait desync{label_,
                          &mine,
                          what,
                          [](void const* c) {
                            auto const& r = *static_cast<pending_records const*>(c);
                            return r.comm->world_ranks(r.missing());
                          },
                          &records,
                          [](void const* c) {
                            auto const& r = *static_cast<pending_records const*>(c);
                            return r.comm->world_ranks(r.comm->all_ranks());
                          }};
  wait_all(
      requests.data(), static_cast<int>(requests.size()), what,
      [&](MPI_Request* pending) {
        std::vector<int> const missing = records.missing();
        abandon(pending, static_cast<int>(requests.size()));
        time_out(what, missing);
      },
      &desync);
  remember(all);
  return all;
}

template <class T, class Record, class SendsData, class Place>
Record MpiComm::pair_exchange(Record const& mine, T const* in, std::size_t count, SendsData&& sends_data,
                              Place&& place) const {
  static_assert(std::is_trivially_copyable_v<Record>,
                "shardwise::MpiComm::pair_exchange: the record is sent as bytes, so its type must be trivially "
                "copyable; send a plain struct of numbers");
  MPI_Comm const c = internal();
  int const peer = 1 - rank();
  Record theirs;
  MPI_Request requests[3];
  int sends = 2;
  detail::mpi_check(MPI_Irecv(&theirs, sizeof(Record), MPI_BYTE, peer, 0, c, &requests[0]), "MPI_Irecv");
  detail::mpi_check(MPI_Isend(&mine, sizeof(Record), MPI_BYTE, peer, 0, c, &requests[1]), "MPI_Isend");
  if (sends_data(mine)) {
    int const n = detail::mpi_count(count, "all_gather");
    detail::mpi_check(MPI_Isend(in, n, detail::mpi_datatype<T>(), peer, 1, c, &requests[2]), "MPI_Isend");
  } else {
    sends = 1;
  }
  char const* what = "pair_exchange";
  if constexpr (std::is_same_v<Record, detail::call_record>) what = detail::kind_name(mine.kind).data();
  std::optional<detail::mpi_wait> desync;  // a collective's records take part in the desync check
  if constexpr (std::is_same_v<Record, detail::call_record>) {
    desync.emplace(detail::mpi_wait{label_, &mine, what,
                                    [](void const* c) {
                                      auto const& self = *static_cast<MpiComm const*>(c);
                                      return self.world_ranks({1 - self.rank()});
                                    },
                                    this,
                                    [](void const* c) {
                                      auto const& self = *static_cast<MpiComm const*>(c);
                                      return self.world_ranks({0, 1});
                                    }});
  }
  wait_all(
      requests, 1, what,
      [&](MPI_Request* pending) {
        abandon(pending, 1);
        time_out(what, {peer});
      },
      desync ? &*desync : nullptr);
  if constexpr (std::is_same_v<Record, detail::call_record>) {
    std::vector<detail::call_record> both(2);
    both[static_cast<std::size_t>(peer)] = theirs;
    remember(both);
  }
  auto drop = [&] {
    if (sends_data(static_cast<Record const&>(theirs))) discard(c, peer, 1, probed_bytes(c, peer, 1));
  };
  try {
    auto const placed = place(static_cast<Record const&>(theirs));  // (where, count): no structured binding, which
    auto* const where = placed.first;                               // clang before 16 cannot capture
    int const n = detail::mpi_count(placed.second, "all_gather");
    data_phase(what, [&] {
      if (where == nullptr)
        drop();
      else
        detail::mpi_check(MPI_Recv(where, n, detail::mpi_datatype<T>(), peer, 1, c, MPI_STATUS_IGNORE), "MPI_Recv");
    });
  } catch (...) {
    data_phase(what, [&] {
      drop();
      MPI_Waitall(sends, requests + 1, MPI_STATUSES_IGNORE);
    });
    throw;
  }
  data_phase(what, [&] { detail::mpi_check(MPI_Waitall(sends, requests + 1, MPI_STATUSES_IGNORE), "MPI_Waitall"); });
  return theirs;
}

}  // namespace shardwise
