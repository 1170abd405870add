#pragma once
// How an MPI job fails as a whole: MPI is initialised once per process with a terminate handler, so an
// exception that escapes a rank ends the job (its message to stderr and to the other ranks, then MPI_Abort);
// a failing rank's message travels on a duplicate of the world that the other ranks probe while they wait in
// a collective, and raise there.
#include <mpi.h>

#include <boost/mpi/environment.hpp>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include "shardwise/core/error.hpp"

namespace shardwise::detail {

/// The process-wide channel on which a failing rank tells every other rank why (a duplicate of the world,
/// so notices never meet user or collective traffic), and whether this rank has told them already.
struct mpi_notices {
  MPI_Comm comm = MPI_COMM_NULL;
  bool told = false;
  bool heard = false;       // a peer's failure notice arrived (and was raised here)
  std::string heard_error;  // the error raised for it: relayed by nobody
  std::string text;         // kept alive while the notices are in flight
};
inline mpi_notices& notices() {
  static mpi_notices state;
  return state;
}

/// Sends `message` to every other rank of the world, once; they raise it at their next collective or wait.
/// A rank whose error is the one raised for a peer's notice tells nobody: the peer told every rank already, and a
/// relayed notice could reach a third rank first and name the relaying rank instead of the one that failed. (A
/// rank that caught that error and failed later for a reason of its own does tell.)
inline void mpi_tell_peers(std::string_view message) {
  auto& n = notices();
  if (n.comm == MPI_COMM_NULL || n.told || (n.heard && message == n.heard_error)) return;
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
  n.heard_error = concat("shardwise: world rank ", status.MPI_SOURCE, " failed, so rank ", rank, " of mesh axis \"",
                         axis, "\" stops waiting in ", what, ". Its error: ", text);
  fail(n.heard_error);
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

}  // namespace shardwise::detail
