// Tensor parallelism on the thread mesh at TP 1, 2 and 4, in fp64 and fp32; test_mpi_nn.cpp runs the same
// cases under mpiexec.
#include <doctest/doctest.h>

#include "cases/nn_cases.hpp"

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, fp64, thread mesh") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto& world) { nn_cases::check_all<double>(world); });
  }
}

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, fp32, thread mesh") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto& world) { nn_cases::check_all<float>(world); });
  }
}
