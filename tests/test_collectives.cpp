// Collectives on Eigen tensors on the serial and thread meshes at 1, 2, 3 (uneven) and 4 ranks;
// test_collectives_xtensor.cpp does xtensor, test_mpi_*.cpp run the same cases under mpiexec.
#include <doctest/doctest.h>

#include "cases/collective_cases.hpp"

TEST_CASE("collectives on Eigen tensors, serial mesh") {
  cases::check_all_collectives<cases::eigen_types>(shardwise::serial_world());
}

TEST_CASE("collectives on Eigen tensors, thread mesh at 1, 2, 3 and 4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto& world) { cases::check_all_collectives<cases::eigen_types>(world); });
  }
}
