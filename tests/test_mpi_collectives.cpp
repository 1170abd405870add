// The collective cases of test_collectives*.cpp on the MPI mesh; CTest runs this under mpiexec -n 1, 2, 3, 4.
#include <doctest/doctest.h>

#include <shardwise/mesh/mpi/comm.hpp>

#include "cases/collective_cases.hpp"

TEST_CASE("collectives on Eigen tensors, MPI mesh") {
  auto const world = shardwise::mpi_world();
  cases::check_all_collectives<cases::eigen_types>(world);
}

TEST_CASE("collectives on xtensor tensors, MPI mesh") {
  auto const world = shardwise::mpi_world();
  cases::check_all_collectives<cases::xtensor_types>(world);
}
