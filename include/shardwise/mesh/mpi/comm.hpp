#pragma once
// Ranks as MPI processes, on Boost.MPI communicators (one per mesh axis). Data moves with plain MPI calls so
// built-in reductions reach MPI as MPI_SUM/MPI_MAX/MPI_MIN on native types, and all-reduce runs in place.
#include <mpi.h>

#include <algorithm>
#include <boost/mpi/communicator.hpp>
#include <boost/mpi/environment.hpp>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/reduce.hpp"
#include "shardwise/mesh/mpi/collectives.hpp"
#include "shardwise/mesh/mpi/datatype.hpp"
#include "shardwise/mesh/mpi/desync.hpp"
#include "shardwise/mesh/mpi/failure.hpp"
#include "shardwise/mesh/mpi/watchdog.hpp"
#include "shardwise/mesh/timeout.hpp"
#include "shardwise/mesh/wait_notice.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise {

namespace detail {
/// A wait polls its requests without pause for this long, then sleeps between polls: a waiting rank that keeps
/// polling takes processor time from the peers it waits for when ranks outnumber cores.
inline constexpr std::chrono::microseconds mpi_poll_spin{200};
inline constexpr std::chrono::microseconds mpi_poll_sleep{20};
}  // namespace detail

/// An MPI communicator (through Boost.MPI): the world of one process per rank, or a mesh axis split from it.
class MpiComm {
 public:
  /// The collective algorithms: ranks are separate processes, so data goes through MPI.
  using collectives = detail::mpi_collectives;

  /// Wraps `comm`, labelled `label` (the name errors give it); `env` keeps MPI initialized while it lives.
  /// Collective over `comm`: it duplicates `comm` for shardwise's own messages here, not lazily inside a later
  /// call that a crossing could leave half-done.
  MpiComm(std::shared_ptr<boost::mpi::environment> env, boost::mpi::communicator comm, std::string label)
      : env_(std::move(env)), comm_(std::move(comm)), label_(std::move(label)) {
    state_->internal.emplace(static_cast<MPI_Comm>(comm_), boost::mpi::comm_duplicate);
  }

  [[nodiscard]] int rank() const { return comm_.rank(); }          ///< This rank in the communicator.
  [[nodiscard]] int size() const { return comm_.size(); }          ///< The number of ranks.
  [[nodiscard]] std::string_view label() const { return label_; }  ///< Its name, for errors.
  /// The MPI_Comm, for calling MPI directly.
  [[nodiscard]] MPI_Comm native() const { return static_cast<MPI_Comm>(comm_); }
  /// The Boost.MPI communicator it wraps.
  [[nodiscard]] boost::mpi::communicator const& boost_communicator() const { return comm_; }

  /// The number of this rank's next collective call on the communicator (0, 1, 2, ...), which its peers must
  /// match; copies of one MpiComm count together.
  [[nodiscard]] std::uint64_t next_call_number() const { return state_->calls++; }

  /// MPI_Barrier over the communicator.
  void barrier(char const* = "barrier") const {
    data_phase("barrier", [&] { detail::mpi_check(MPI_Barrier(native()), "MPI_Barrier"); });
  }

  /// Ranks with the same color form a new communicator, ordered by key then rank, labelled `label`. Collective.
  [[nodiscard]] MpiComm split(int color, int key, std::string_view label) const {
    // Agreed first, as every collective is, so that a rank that never comes is named after the timeout
    // instead of leaving MPI_Comm_split waiting forever.
    detail::mpi_collectives::agree(*this, detail::make_call<char>(*this, detail::collective_kind::split, {},
                                                                  storage_order::row_major, call_site{nullptr, 0}));
    MpiComm part(env_, comm_.split(color, key), std::string(label));
    part.set_timeout(timeout());
    return part;
  }

  /// How long a rank waits in a collective on this communicator (and on those split from it afterwards)
  /// before it raises, naming the ranks that did not arrive. Call it on every rank.
  void set_timeout(timeout_duration limit) const { state_->timeout = limit; }
  /// The current limit: SHARDWISE_TIMEOUT seconds, 30 minutes by default, or what set_timeout gave.
  [[nodiscard]] timeout_duration timeout() const { return state_->timeout; }

  /// Every rank's value of a small trivially copyable record (shapes, for checking them).
  template <class V>
  [[nodiscard]] std::vector<V> all_gather_value(V const& mine) const {
    static_assert(std::is_trivially_copyable_v<V>,
                  "shardwise::MpiComm::all_gather_value: the value is sent as bytes, so its type must be trivially "
                  "copyable; gather a tensor with sw::all_gather instead");
    std::vector<V> all(static_cast<std::size_t>(size()));
    gather_bytes_into(&mine, sizeof(V), all.data());
    return all;
  }
  /// Every rank's `bytes` bytes from `mine`, in rank order (all_gather_value for a record known by its size).
  [[nodiscard]] std::vector<unsigned char> all_gather_bytes(void const* mine, std::size_t bytes) const {
    std::vector<unsigned char> all(static_cast<std::size_t>(size()) * bytes);
    gather_bytes_into(mine, bytes, all.data());
    return all;
  }

  /// In place. Buffers above 16 MiB go in 16 MiB pieces: OpenMPI allocates a temporary as large as the
  /// message, and above glibc's 32 MiB mmap ceiling that is a fresh mapping on every call (8193 page faults per
  /// 64 MiB call here, ~44 ms against 16-20 ms in pieces). Smaller pieces were measured slower at 16 MiB
  /// (4 x 4 MiB: 1.3-1.4x one 16 MiB call), so anything that fits goes whole.
  template <class T>
  void all_reduce(T* data, std::size_t n, detail::op_kind op) const {
    constexpr std::size_t piece = (std::size_t{16} << 20) / sizeof(T);
    detail::dispatch_op(op, [&]<detail::op_kind Op>() {
      data_phase("all_reduce", [&] {
        for (std::size_t start = 0; start < n; start += piece) {
          std::size_t const count = std::min(piece, n - start);
          detail::mpi_check(MPI_Allreduce(MPI_IN_PLACE, data + start, static_cast<int>(count),
                                          detail::mpi_datatype<T>(), detail::mpi_op<T, Op>(), native()),
                            "MPI_Allreduce");
        }
      });
    });
  }

  /// Rank q's `counts[q]` elements, concatenated in rank order into `out`.
  template <class T>
  void all_gatherv(T const* in, T* out, std::vector<std::size_t> const& counts) const {
    if (std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; })) {
      int const count = detail::mpi_count(counts[0], "all_gather");  // equal pieces: MPI's own all-gather
      data_phase("all_gather", [&] {
        detail::mpi_check(
            MPI_Allgather(in, count, detail::mpi_datatype<T>(), out, count, detail::mpi_datatype<T>(), native()),
            "MPI_Allgather");
      });
      return;
    }
    auto const pieces = counts_and_displacements(counts, "all_gather");  // sizes, offsets
    data_phase("all_gather", [&] {
      detail::mpi_check(
          MPI_Allgatherv(in, pieces.first[static_cast<std::size_t>(rank())], detail::mpi_datatype<T>(), out,
                         pieces.first.data(), pieces.second.data(), detail::mpi_datatype<T>(), native()),
          "MPI_Allgatherv");
    });
  }

  /// all_gatherv started (MPI_Iallgatherv); the returned collective waits for it under the timeout. The counts
  /// and offsets live in the collective until then, as MPI requires.
  template <class T>
  [[nodiscard]] pending_collective start_all_gatherv(T const* in, T* out, std::vector<std::size_t> const& counts,
                                                     detail::call_record const& call) const {
    struct started {
      std::pair<std::vector<int>, std::vector<int>> pieces;  // sizes, offsets
      MPI_Request request = MPI_REQUEST_NULL;
    };
    auto transfer = std::make_shared<started>();
    transfer->pieces = counts_and_displacements(counts, "all_gather_start");
    auto const& [sizes, offsets] = transfer->pieces;
    detail::mpi_check(
        MPI_Iallgatherv(in, sizes[static_cast<std::size_t>(rank())], detail::mpi_datatype<T>(), out, sizes.data(),
                        offsets.data(), detail::mpi_datatype<T>(), native(), &transfer->request),
        "MPI_Iallgatherv");
    return pending_collective([self = *this, transfer, call = call.spelled()] {  // texts: the caller's may be gone
      self.wait_all(&transfer->request, 1, "all_gather_start", [&](MPI_Request*) {
        detail::fail("shardwise::all_gather_start on mesh axis \"", self.label_, "\": rank ", self.rank(), " waited ",
                     detail::seconds_text(self.timeout()), " in wait() for ", call,
                     " to finish: a peer stopped mid-transfer or never waits for it. Raise the limit with "
                     "SHARDWISE_TIMEOUT (seconds) or set_timeout if the transfer is just slow");
      });
    });
  }

  /// Waits for `count` requests, polling (without pause for 200 µs, then sleeping 20 µs between polls),
  /// so that a failure notice from another rank or the time limit ends the wait: then on_timeout(requests) (which must
  /// raise; the requests still pending are not null) runs. With `desync` (a collective's records), the wait takes part
  /// in the desync check (mesh/mpi/desync.hpp), which raises when it cannot complete; whatever raises, the pending
  /// requests are abandoned first.
  template <class OnTimeout>
  void wait_all(MPI_Request* requests, int count, char const* what, OnTimeout&& on_timeout,
                detail::mpi_wait* desync = nullptr) const {
    auto const start = std::chrono::steady_clock::now();
    auto const deadline = start + timeout();
    auto next_check = start + detail::desync_first_check(timeout());
    int notices = 0;
    auto next_notice = detail::wait_notice_due(start, state_->notice, 0);
    std::optional<detail::mpi_wait_scope> checked;
    if (desync != nullptr) checked.emplace(*desync);
    auto const or_abandon = [&](auto&& step) {
      try {
        step();
      } catch (...) {
        abandon(requests, count);
        throw;
      }
    };
    // A collective first takes a desync verdict that came while this rank computed: its records may all have
    // come already (sent by ranks that left the poisoned call), and the wait below would not poll.
    if (desync != nullptr) or_abandon([&] { detail::mpi_poll_side_channel(what, label_, rank()); });
    bool sleeping = false;
    for (unsigned spin = 0, round = 0;; ++spin) {
      int done = 0;
      detail::mpi_check(MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
      if (done) return;
      if (spin % 64 == 63) {
        auto const now = std::chrono::steady_clock::now();
        sleeping = now - start >= detail::mpi_poll_spin;
        or_abandon([&] {
          detail::mpi_poll_side_channel(what, label_, rank());
          if (desync != nullptr && now >= next_check) {
            detail::mpi_desync_round(round++);
            next_check = now + detail::desync_recheck(timeout());
          }
        });
        if (now >= deadline) on_timeout(requests);
        if (desync != nullptr && now >= next_notice) {
          print_notice(*desync, notices);
          next_notice = detail::wait_notice_due(start, state_->notice, ++notices);
        }
      }
      if (sleeping) std::this_thread::sleep_for(detail::mpi_poll_sleep);
    }
  }

  /// Every rank's call record, exchanged point to point so that a rank that does not arrive is named (with the
  /// last call it made here) when the time limit passes, and a failed rank's notice ends the wait.
  [[nodiscard]] std::vector<detail::call_record> all_gather_records(detail::call_record const& mine) const;

  /// Two ranks only: sends `mine`, and then (when sends_data(mine)) `count` elements of `in`, to the peer, and
  /// returns the peer's record. When sends_data(theirs), the peer's elements follow: `place(theirs)` says where
  /// they go and how many (nullptr: received and dropped, as when the calls disagree). The records travel on a
  /// private duplicate of the communicator, so checking one costs no round trip of its own when data follows.
  /// If `place` throws, the peer's data is still received and this rank's sends complete, so nothing stays
  /// pending, and the error propagates.
  template <class T, class Record, class SendsData, class Place>
  Record pair_exchange(Record const& mine, T const* in, std::size_t count, SendsData&& sends_data, Place&& place) const;

  /// Reduces `in` (the concatenation of every rank's piece) over ranks; this rank keeps piece `rank()`.
  template <class T>
  void reduce_scatterv(T const* in, T* out, std::vector<std::size_t> const& counts, detail::op_kind op) const {
    // Not a structured binding: clang before 16 cannot capture one in the lambda below.
    std::vector<int> const sizes = counts_and_displacements(counts, "reduce_scatter").first;
    detail::dispatch_op(op, [&]<detail::op_kind Op>() {
      data_phase("reduce_scatter", [&] {
        detail::mpi_check(
            MPI_Reduce_scatter(in, out, sizes.data(), detail::mpi_datatype<T>(), detail::mpi_op<T, Op>(), native()),
            "MPI_Reduce_scatter");
      });
    });
  }

  /// Root's `n` elements at `data` into every rank's `data` (MPI_Bcast).
  template <class T>
  void broadcast(T* data, std::size_t n, int root) const {
    int const count = detail::mpi_count(n, "broadcast");
    data_phase("broadcast", [&] {
      detail::mpi_check(MPI_Bcast(data, count, detail::mpi_datatype<T>(), root, native()), "MPI_Bcast");
    });
  }

  /// Sends send_counts[q] elements of `send` (in rank order) to rank q and receives recv_counts[q] from rank q
  /// into `recv`, in rank order (MPI_Alltoallv).
  template <class T>
  void all_to_allv(T const* send, std::vector<std::size_t> const& send_counts, T* recv,
                   std::vector<std::size_t> const& recv_counts) const {
    auto const sends = counts_and_displacements(send_counts, "all_to_all");
    auto const receives = counts_and_displacements(recv_counts, "all_to_all");
    data_phase("all_to_all", [&] {
      detail::mpi_check(
          MPI_Alltoallv(send, sends.first.data(), sends.second.data(), detail::mpi_datatype<T>(), recv,
                        receives.first.data(), receives.second.data(), detail::mpi_datatype<T>(), native()),
          "MPI_Alltoallv");
    });
  }

  /// Sends raw bytes with the tensor shape they came from to rank `destination`.
  void send_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const;

  /// Like send_bytes, but returns at once, as the thread mesh's send always does: the bytes are copied and
  /// sent in the background (MPI_Isend), so two ranks that send to each other before receiving cannot wait on
  /// each other (pipeline schedules rely on it). finish_sends() waits for them.
  void post_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const;

  /// The post_bytes sends of this communicator whose copies are held: those MPI may still be reading. Each
  /// post_bytes first frees the ones it is done with; finish_sends waits for the rest.
  [[nodiscard]] std::size_t sends_in_flight() const { return state_->posted.size(); }

  /// Waits until every post_bytes send of this communicator has been received (under the timeout).
  void finish_sends() const;

  /// Frees the oldest post_bytes sends MPI is done with (without waiting), up to the first still in flight.
  void reap_finished_sends() const;

  /// Blocks until a message from `source` with `tag` arrives, then hands it to take(shape, bytes).
  template <class Take>
  void recv_bytes(int source, int tag, Take&& take) const;

  /// Like recv_bytes, but the message lands where `where(shape, byte_count)` says (a pointer to at least
  /// byte_count bytes): no staging buffer as large as the message. If `where` throws (a shape this rank cannot
  /// take), the message is still received, into a scratch buffer, so that none is left pending, and the error
  /// propagates.
  template <class Where>
  void recv_into(int source, int tag, Where&& where) const;

 private:
  void gather_bytes_into(void const* mine, std::size_t bytes, void* all) const {
    int const count = detail::mpi_count(bytes, "MpiComm::all_gather_bytes");
    data_phase("gather_values", [&] {
      detail::mpi_check(MPI_Allgather(mine, count, MPI_BYTE, all, count, MPI_BYTE, native()), "MPI_Allgather");
    });
  }
  /// Runs one blocking MPI call that moves a collective's data, after the ranks agreed on the call; if it lasts
  /// longer than the timeout, a peer stopped or the network failed mid-transfer, and the job ends with a
  /// message (see mpi_data_watchdog).
  template <class MoveData>
  void data_phase(char const* what, MoveData&& move_data) const {
    point_to_point(what,
                   "every rank had agreed on the call, so a peer stopped or the network failed while the data moved",
                   move_data);
  }

  /// Runs blocking MPI calls of `what` under the timeout; `stalled` says what a stall means.
  template <class MoveData>
  void point_to_point(char const* what, char const* stalled, MoveData&& move_data) const {
    detail::mpi_data_watchdog::instance().guard({what, stalled, label_, rank(), timeout(), state_->notice}, move_data);
  }

  /// Gives up on requests after a timeout: receives are cancelled, sends left to MPI.
  static void abandon(MPI_Request* requests, int count) {
    for (int i = 0; i < count; ++i) {
      if (requests[i] == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&requests[i]);
      MPI_Request_free(&requests[i]);
    }
  }

  /// The peers' records of the call just agreed, kept for the next timeout message.
  void remember(std::vector<detail::call_record> const& all) const {
    state_->last_calls.resize(all.size());
    for (std::size_t q = 0; q < all.size(); ++q)
      if (static_cast<int>(q) != rank()) state_->last_calls[q] = all[q];
  }

  [[noreturn]] void time_out(char const* what, std::vector<int> const& missing) const {
    detail::collective_timed_out(rank(), label_, timeout(), what, whereabouts(missing));
  }

  /// Where the ranks `missing` of this communicator are, for a timeout or a wait notice: the wait the desync
  /// check heard of, else the last call each made here.
  [[nodiscard]] std::string whereabouts(std::vector<int> const& missing) const {
    std::vector<int> const world = world_ranks(missing);
    auto const& answers = detail::desync_state().answers;  // what the desync check heard from them, if anything
    std::ostringstream who;
    for (std::size_t i = 0; i < missing.size(); ++i) {
      auto const q = static_cast<std::size_t>(missing[i]);
      who << (i ? "; " : "") << "rank " << q;
      auto const heard = answers.find(world[i]);
      if (heard != answers.end() && heard->second.has_last &&
          heard->second.last.activity.what == detail::rank_activity::state::waiting)
        who << " is waiting in " << detail::text_of(heard->second.last.activity.call) << " on mesh axis \""
            << detail::text_of(heard->second.last.activity.axis) << '"';
      else if (q < state_->last_calls.size() && state_->last_calls[q].element[0] != '\0')
        who << " has not arrived (its last call on this axis: " << state_->last_calls[q] << " as call #"
            << state_->last_calls[q].sequence << ")";
      else
        who << " has not arrived (it has made no call on this axis yet)";
    }
    return who.str();
  }

  /// The k-th notice of a long wait `w` (mesh/wait_notice.hpp), printed by the lowest rank of the communicator
  /// that waits, so that the axis gives one line.
  void print_notice(detail::mpi_wait const& w, int k) const {
    std::vector<int> const gone = w.missing(w.context);  // world ranks
    std::vector<int> everyone(static_cast<std::size_t>(size()));
    for (int q = 0; q < size(); ++q) everyone[static_cast<std::size_t>(q)] = q;
    std::vector<int> const world = world_ranks(everyone);
    std::vector<int> waiting, missing;
    for (int q = 0; q < size(); ++q) {
      bool const away = std::find(gone.begin(), gone.end(), world[static_cast<std::size_t>(q)]) != gone.end();
      (away ? missing : waiting).push_back(q);
    }
    if (missing.empty() || waiting.empty() || waiting.front() != rank()) return;
    std::string const text = detail::wait_notice_text(label_, waiting, w.call ? detail::call_text(*w.call) : w.what,
                                                      whereabouts(missing), state_->notice, k, timeout());
    std::fprintf(stderr, "%s\n", text.c_str());
    std::fflush(stderr);
  }

  /// The world ranks of ranks of this communicator.
  /// The ranks of this communicator: 0, 1, ..., size() - 1.
  [[nodiscard]] std::vector<int> all_ranks() const {
    std::vector<int> ranks(static_cast<std::size_t>(size()));
    for (int q = 0; q < size(); ++q) ranks[static_cast<std::size_t>(q)] = q;
    return ranks;
  }

  [[nodiscard]] std::vector<int> world_ranks(std::vector<int> const& ranks) const {
    MPI_Group axis_group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
    MPI_Comm_group(native(), &axis_group);
    MPI_Comm_group(MPI_COMM_WORLD, &world_group);
    std::vector<int> world(ranks.size());
    MPI_Group_translate_ranks(axis_group, static_cast<int>(ranks.size()), ranks.data(), world_group, world.data());
    MPI_Group_free(&axis_group);
    MPI_Group_free(&world_group);
    return world;
  }

  void check_peer(int peer, char const* what) const {
    if (peer < 0 || peer >= size() || peer == rank())
      detail::fail("shardwise::", what, " on mesh axis \"", label_, "\": peer rank ", peer,
                   " is not another rank of this axis (size ", size(), ", this rank ", rank(), ")");
  }

  /// The size in bytes of the next message from `source` with `tag`, once it has arrived.
  static int probed_bytes(MPI_Comm c, int source, int tag) {
    MPI_Status status;
    detail::mpi_check(MPI_Probe(source, tag, c, &status), "MPI_Probe");
    int bytes = 0;
    MPI_Get_count(&status, MPI_BYTE, &bytes);
    return bytes;
  }

  /// Receives a message of `bytes` bytes and drops it, so that a refused message is not left pending.
  static void discard(MPI_Comm c, int source, int tag, int bytes) {
    std::vector<unsigned char> scratch(static_cast<std::size_t>(bytes));
    detail::mpi_check(MPI_Recv(scratch.data(), bytes, MPI_BYTE, source, tag, c, MPI_STATUS_IGNORE), "MPI_Recv");
  }

  static std::pair<std::vector<int>, std::vector<int>> counts_and_displacements(std::vector<std::size_t> const& counts,
                                                                                char const* what) {
    std::vector<int> sizes(counts.size()), offsets(counts.size());
    std::size_t offset = 0;
    for (std::size_t q = 0; q < counts.size(); ++q) {
      sizes[q] = detail::mpi_count(counts[q], what);
      offsets[q] = detail::mpi_count(offset, what);
      offset += counts[q];
    }
    detail::mpi_count(offset, what);
    return {std::move(sizes), std::move(offsets)};
  }

  /// The communicator for shardwise's own point-to-point traffic, so it never meets a user's send/recv.
  MPI_Comm internal() const { return static_cast<MPI_Comm>(*state_->internal); }

  std::shared_ptr<boost::mpi::environment> env_;  // declared first: destroyed after the communicators
  boost::mpi::communicator comm_;
  std::string label_;
  struct shared_state {
    std::optional<boost::mpi::communicator> internal;  // see internal()
    std::uint64_t calls = 0;                           // see next_call_number()
    timeout_duration timeout = detail::default_timeout();
    detail::wait_notice_times notice = detail::default_wait_notice();  // when long waits are reported
    std::vector<detail::call_record> last_calls;  // the peers' latest agreed calls, for timeout messages
    /// One post_bytes send in flight: what it sends, kept alive until MPI is done with it.
    struct posted_send {
      extents shape;                                                   ///< The tensor shape, sent first.
      std::vector<unsigned char> bytes;                                ///< A copy of the data, sent second.
      MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};  ///< The two MPI_Isend requests.
    };
    std::deque<posted_send> posted;  // post_bytes sends in flight (a deque: their addresses stay put)
  };
  std::shared_ptr<shared_state> state_ = std::make_shared<shared_state>();
};

/// The MPI world; initialises MPI on first use. Launch with mpiexec.
[[nodiscard]] inline MpiComm mpi_world(int& argc, char**& argv) {
  auto env = detail::mpi_environment(&argc, &argv);
  return MpiComm(std::move(env), boost::mpi::communicator(), "world");
}
[[nodiscard]] inline MpiComm mpi_world() {
  auto env = detail::mpi_environment();
  return MpiComm(std::move(env), boost::mpi::communicator(), "world");
}

namespace detail {
/// Tests only: this process's desync test holds (mesh/desync.hpp).
inline desync_test_holds& desync_test_holds_of(MpiComm const&) { return desync_state().test_holds; }
}  // namespace detail

}  // namespace shardwise

// The point-to-point members and the call agreement, defined apart (they need the whole class).
#include "shardwise/mesh/mpi/agreement.hpp"
#include "shardwise/mesh/mpi/point_to_point.hpp"
