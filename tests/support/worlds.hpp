#pragma once
// The world the paired test files hand their cases (test_X.cpp on threads, test_mpi_X.cpp under mpiexec, built
// into one binary): sw::RuntimeComm, what sw::launch gives a user's program. A case is then compiled once and runs
// on both backends: CTest starts the binary directly for the thread-mesh cases and under mpiexec for the MPI ones
// (doctest suite "mpi"). Without MPI in the build the thread cases get the ThreadComm itself.
#include <shardwise/mesh/thread/comm.hpp>
#include <utility>

#if defined(SHARDWISE_TEST_WITH_MPI)
#include <shardwise/mesh/mpi/comm.hpp>
#include <shardwise/mesh/runtime.hpp>
#endif

namespace worlds {

/// Runs fn(world) on `ranks` thread ranks, world a sw::RuntimeComm over the thread mesh (with MPI in the build).
template <class Fn>
void run_threads(int ranks, Fn&& fn) {
  shardwise::run_threads(ranks, [&](shardwise::ThreadComm& threads) {
#if defined(SHARDWISE_TEST_WITH_MPI)
    shardwise::RuntimeComm world(threads);
    fn(world);
#else
    fn(threads);
#endif
  });
}

#if defined(SHARDWISE_TEST_WITH_MPI)
/// This process's MPI world (the binary started by mpiexec), as a sw::RuntimeComm.
inline shardwise::RuntimeComm mpi() { return shardwise::RuntimeComm(shardwise::mpi_world()); }
#endif

}  // namespace worlds
