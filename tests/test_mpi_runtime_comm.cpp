// sw::RuntimeComm over MPI (runtime_comm_cases.hpp); CTest runs it under mpiexec -n 1, 2 and 4.
#include <doctest/doctest.h>

#include "cases/runtime_comm_cases.hpp"

TEST_CASE("RuntimeComm over MPI: the MPI mesh's cases pass through it unchanged") {
  runtime_comm_cases::check_all(shardwise::mpi_world());
}
