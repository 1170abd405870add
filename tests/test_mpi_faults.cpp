// The collective fault matrix of test_faults.cpp on the MPI mesh; CTest runs this under mpiexec -n 2 and 4.
#include <doctest/doctest.h>

#include <chrono>
#include <shardwise/mesh/mpi/comm.hpp>

#include "cases/fault_cases.hpp"

TEST_CASE("mismatched collective calls raise the same error on every rank, MPI mesh") {
  cases::check_mismatched_calls(shardwise::mpi_world());
}

TEST_CASE("desyncs are found in seconds with the default timeout, naming every rank's call, MPI mesh") {
  cases::check_desyncs_found(shardwise::mpi_world());
}

TEST_CASE("a desync's verdict reaches ranks held back while it was found, MPI mesh") {
  using namespace std::chrono_literals;
  auto const world = shardwise::mpi_world();
  auto const now = [] { return std::chrono::steady_clock::now(); };
  // The ranks between the first and the last answer nothing for 8 s, so rank 0 finds the cycle with the last
  // rank alone (about 4 s in); they wait on axis "b" all the same, and must raise the same message, not stay
  // waiting for rank 0 or find a new cycle with it in its next collective. (At 2 ranks none is held.)
  cases::check_crossing_with_held_ranks(world, "ranks that did not answer", [&](auto const& w) {
    if (w.rank() > 0 && w.rank() < w.size() - 1) shardwise::detail::desync_test_holds_of(w).quiet_until = now() + 8s;
  });
  // The last rank takes its verdict 12 s late, answering meanwhile that it waits on "b" for rank 0: rank 0, in
  // its next collective, must not take that for a new cycle.
  cases::check_crossing_with_held_ranks(world, "a verdict taken late", [&](auto const& w) {
    if (w.rank() == w.size() - 1) shardwise::detail::desync_test_holds_of(w).verdicts_until = now() + 12s;
  });
}
