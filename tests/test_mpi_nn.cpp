// The tensor-parallel and expert-parallel cases of test_nn.cpp and the cost cases of test_cost.cpp (the Llama block's
// predicted transfers against a counting MPI mesh) on the MPI mesh; CTest runs this under mpiexec -n 1, 2, 4.
#include <doctest/doctest.h>

#include "cases/cost_cases.hpp"
#include "cases/expert_parallel_cases.hpp"
#include "cases/nn_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("tensor-parallel styles and blocks equal the unsharded run, MPI mesh") {
  auto const world = worlds::mpi();
  nn_cases::check_all<double>(world);
  nn_cases::check_all<float>(world);
}

TEST_CASE("the Llama block's predicted cost equals what a counting MPI mesh records") {
  cost_cases::run_cost_cases(worlds::mpi());
}

TEST_CASE("experts placed over the ep ranks equal the unsharded block on every rank's tokens, MPI mesh") {
  expert_parallel_cases::check_expert_parallel(worlds::mpi());
}
