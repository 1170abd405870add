#pragma once
// How an MPI job fails as a whole: MPI is initialised once per process with a terminate handler, so an
// exception that escapes a rank ends the job (its message to stderr and to the other ranks, then MPI_Abort);
// a failing rank's message travels on a duplicate of the world that the other ranks probe while they wait in
// a collective, and raise there.
#include <mpi.h>

#include <array>
#include <boost/mpi/environment.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shardwise/core/error.hpp"

namespace shardwise::detail {

/// The process-wide channel on which a failing rank tells every other rank why (a duplicate of the world,
/// so notices never meet user or collective traffic), and whether this rank has told them already.
struct mpi_notices {
  MPI_Comm comm = MPI_COMM_NULL;
  bool told = false;
  bool heard = false;  // a peer's failure notice arrived (and was raised here)
  std::string text;    // kept alive while the notices are in flight
};
inline mpi_notices& notices() {
  static mpi_notices state;
  return state;
}

/// Sends `message` to every other rank of the world, once; they raise it at their next collective or wait.
inline void mpi_tell_peers(std::string_view message) {
  auto& n = notices();
  if (n.comm == MPI_COMM_NULL || n.told) return;
  n.told = true;
  n.text = std::string(message.substr(0, 4000));
  int me = 0, size = 0;
  MPI_Comm_rank(n.comm, &me);
  MPI_Comm_size(n.comm, &size);
  for (int q = 0; q < size; ++q) {
    if (q == me) continue;
    MPI_Request request;
    MPI_Isend(n.text.data(), static_cast<int>(n.text.size()), MPI_CHAR, q, 0, n.comm, &request);
    MPI_Request_free(&request);  // small: delivered eagerly; the text stays alive in `notices()`
  }
}

/// Raises if another rank has sent a failure notice: "rank 2 failed: ...".
inline void mpi_raise_notice(char const* what, std::string_view axis, int rank) {
  auto& n = notices();
  if (n.comm == MPI_COMM_NULL) return;
  int arrived = 0;
  MPI_Status status;
  MPI_Iprobe(MPI_ANY_SOURCE, 0, n.comm, &arrived, &status);
  if (!arrived) return;
  int length = 0;
  MPI_Get_count(&status, MPI_CHAR, &length);
  std::string text(static_cast<std::size_t>(length), '\0');
  MPI_Recv(text.data(), length, MPI_CHAR, status.MPI_SOURCE, 0, n.comm, MPI_STATUS_IGNORE);
  n.heard = true;
  fail("shardwise: world rank ", status.MPI_SOURCE, " failed, so rank ", rank, " of mesh axis \"", axis,
       "\" stops waiting in ", what, ". Its error: ", text);
}

/// Where a rank waits when its time runs out, told to the peers it waits for so that they can name a
/// crossing of sub-mesh orders (each waits on another axis for the other).
struct mpi_whereabouts {
  std::array<char, 32> what{};  ///< The collective it waits in.
  std::array<char, 64> axis{};  ///< The mesh axis it waits on.
};

/// Sends `mine` to the world ranks `peers`, then waits up to `grace` for theirs (a peer whose own time ran out
/// at about the same moment sends its own); returns them in the order of `peers`, empty where none came.
inline std::vector<std::optional<mpi_whereabouts>> mpi_exchange_whereabouts(std::vector<int> const& peers,
                                                                            mpi_whereabouts const& mine,
                                                                            std::chrono::milliseconds grace) {
  constexpr int tag = 1;  // failure notices use tag 0
  std::vector<std::optional<mpi_whereabouts>> theirs(peers.size());
  auto& n = notices();
  if (n.comm == MPI_COMM_NULL) return theirs;
  static mpi_whereabouts sent;  // outlives the eager sends, which are not waited for
  sent = mine;
  for (int peer : peers) {
    MPI_Request request;
    MPI_Isend(&sent, sizeof sent, MPI_BYTE, peer, tag, n.comm, &request);
    MPI_Request_free(&request);
  }
  auto const deadline = std::chrono::steady_clock::now() + grace;
  for (std::size_t answered = 0; answered < peers.size() && std::chrono::steady_clock::now() < deadline;) {
    for (std::size_t i = 0; i < peers.size(); ++i) {
      int arrived = 0;
      if (theirs[i]) continue;
      MPI_Iprobe(peers[i], tag, n.comm, &arrived, MPI_STATUS_IGNORE);
      if (!arrived) continue;
      theirs[i].emplace();
      MPI_Recv(&*theirs[i], sizeof(mpi_whereabouts), MPI_BYTE, peers[i], tag, n.comm, MPI_STATUS_IGNORE);
      ++answered;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return theirs;
}

/// Ends the whole job after `message` went to stderr: MPI_Abort, and if the job is not gone in 5 s, _Exit
/// (MPI_Abort was seen to hang when several ranks abort while another waits in MPI_Finalize; mpiexec then ends
/// the job, because a rank exited without finalizing).
[[noreturn]] inline void mpi_abort_job() {
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(5));
    std::_Exit(1);
  }).detach();
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

/// An exception that escapes a rank ends the whole job: its message goes to the other ranks and to stderr,
/// then MPI_Abort (a rank that just died would leave its peers waiting until their timeout).
[[noreturn]] inline void mpi_terminate() {
  std::string message = "an unknown exception";
  if (auto current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (std::exception const& e) {
      message = e.what();
    } catch (...) {
    }
  }
  int me = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  std::fprintf(stderr, "shardwise: rank %d ends the job (MPI_Abort) after an uncaught exception: %s\n", me,
               message.c_str());
  std::fflush(stderr);
  mpi_tell_peers(message);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the notices leave before the abort
  mpi_abort_job();
}

/// Ends this rank with exit code 1 after world rank `peer` failed (-1: a failure notice raised here, or this
/// rank's own failure told to its peers, earlier), instead of waiting for the others in MPI_Finalize.
[[noreturn]] inline void mpi_end_after_peer_failure(int peer) {
  int me = -1;
  MPI_Comm_rank(notices().comm, &me);
  std::fflush(stdout);
  if (peer >= 0)
    std::fprintf(stderr, "shardwise: rank %d finished, but world rank %d failed; ending with exit code 1\n", me, peer);
  else
    std::fprintf(stderr, "shardwise: rank %d finished after a failure in the job; ending with exit code 1\n", me);
  std::fflush(stderr);
  std::_Exit(1);
}

/// Before MPI_Finalize: waits until every rank has reached it. Once the job has failed (a failure notice arrived
/// here, before or during the wait, or this rank told its peers of its own), it ends this rank with exit code 1
/// instead: when every rank has arrived, or after a grace of a few seconds for the failed and failing ranks to
/// print their errors, since mpiexec stops the whole job at the first rank that exits with an error. OpenMPI's
/// MPI_Finalize waits for every peer, and a rank waiting there was seen to outlive MPI_Abort from its failing
/// peers by minutes (CI, 4 ranks on 2 cores). A peer that dies without a notice (a signal) is mpiexec's to
/// end, as before. Nothing to do when the program finalised MPI itself.
inline void mpi_await_peers_before_finalize() {
  auto& n = notices();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || n.comm == MPI_COMM_NULL) return;
  using clock = std::chrono::steady_clock;
  constexpr auto grace = std::chrono::seconds(5);
  bool failed = n.heard || n.told;
  int failed_peer = -1;  // -1: known before the wait
  auto deadline = clock::now() + grace;
  MPI_Request all_here = MPI_REQUEST_NULL;
  MPI_Ibarrier(n.comm, &all_here);
  for (int done = 0;;) {
    MPI_Test(&all_here, &done, MPI_STATUS_IGNORE);
    if (done && !failed) return;
    if (done || (failed && clock::now() > deadline)) mpi_end_after_peer_failure(failed_peer);
    int arrived = 0;
    MPI_Status status;
    if (!failed) MPI_Iprobe(MPI_ANY_SOURCE, 0, n.comm, &arrived, &status);
    if (arrived) failed = true, failed_peer = status.MPI_SOURCE, deadline = clock::now() + grace;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

/// MPI is initialised once per process and finalised at exit, after every communicator is gone and every rank
/// has arrived (mpi_await_peers_before_finalize).
inline std::shared_ptr<boost::mpi::environment> mpi_environment(int* argc = nullptr, char*** argv = nullptr) {
  static std::shared_ptr<boost::mpi::environment> env = [&] {
    auto* raw = argc && argv ? new boost::mpi::environment(*argc, *argv) : new boost::mpi::environment();
    std::shared_ptr<boost::mpi::environment> made(raw, [](boost::mpi::environment* e) {
      mpi_await_peers_before_finalize();
      delete e;
    });
    MPI_Comm_dup(MPI_COMM_WORLD, &notices().comm);
    std::set_terminate(&mpi_terminate);
    return made;
  }();
  return env;
}

}  // namespace shardwise::detail
