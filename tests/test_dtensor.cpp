// Distributed tensors on the serial and thread meshes at 1, 2, 3 (uneven) and 4 ranks; test_mpi_dtensor.cpp
// runs the same cases under mpiexec.
#include <doctest/doctest.h>

#include "cases/dtensor_cases.hpp"

TEST_CASE("distributed tensors on the serial mesh") { cases::check_all_dtensor(shardwise::serial_world()); }

TEST_CASE("distributed tensors on the thread mesh at 1, 2, 3 and 4 ranks") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto& world) { cases::check_all_dtensor(world); });
  }
}
