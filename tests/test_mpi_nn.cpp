// The tensor-parallel cases of test_nn.cpp on the MPI mesh; CTest runs this under mpiexec -n 1, 2, 4.
#include <doctest/doctest.h>

#include <shardwise/mesh/mpi.hpp>

#include "cases/nn_cases.hpp"

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, MPI mesh") {
  auto const world = shardwise::mpi_world();
  nn_cases::check_all<double>(world);
  nn_cases::check_all<float>(world);
}
