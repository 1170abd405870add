// The collective fault matrix of test_faults.cpp on the MPI mesh; CTest runs this under mpiexec -n 2 and 4.
#include <doctest/doctest.h>

#include <shardwise/mesh/mpi.hpp>

#include "cases/fault_cases.hpp"

TEST_CASE("mismatched collective calls raise the same error on every rank, MPI mesh") {
  cases::check_mismatched_calls(shardwise::mpi_world());
}

TEST_CASE("desyncs are found in seconds with the default timeout, naming every rank's call, MPI mesh") {
  cases::check_desyncs_found(shardwise::mpi_world());
}
