// The collective fault matrix on the serial-free meshes: threads at 2, 3 and 4 ranks (test_mpi_faults.cpp
// runs the same cases under mpiexec).
#include <doctest/doctest.h>

#include "cases/fault_cases.hpp"

TEST_CASE("mismatched collective calls raise the same error on every rank, thread mesh") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto const& world) { cases::check_mismatched_calls(world); });
  }
}
