// The distributed tensor cases of test_dtensor.cpp on the MPI mesh; CTest runs this under mpiexec -n 1, 2, 3, 4.
#include <doctest/doctest.h>

#include <shardwise/mesh/mpi/comm.hpp>

#include "cases/dtensor_cases.hpp"

TEST_CASE("distributed tensors on the MPI mesh") {
  auto const world = shardwise::mpi_world();
  cases::check_all_dtensor(world);
}
