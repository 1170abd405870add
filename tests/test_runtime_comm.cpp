// sw::RuntimeComm over threads at 1 to 4 ranks (runtime_comm_cases.hpp); test_mpi_runtime_comm.cpp does MPI.
#include <doctest/doctest.h>

#include "cases/runtime_comm_cases.hpp"

TEST_CASE("RuntimeComm over threads: the thread mesh's cases pass through it unchanged") {
  for (int n = 1; n <= 4; ++n) {
    CAPTURE(n);
    shardwise::run_threads(n, [](shardwise::ThreadComm const& threads) { runtime_comm_cases::check_all(threads); });
  }
}
