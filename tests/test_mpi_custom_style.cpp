// The cases of test_custom_style.cpp (a style written outside the library) on the MPI mesh; CTest runs this under
// mpiexec -n 1, 2 and 4.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "cases/custom_style_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("a style written outside the library trains like the unsharded block, its cost recorded, MPI mesh") {
  custom_style_cases::trains_like_the_unsharded_block(worlds::mpi());
}

TEST_CASE("LoRA adapters on a style written outside the library train like the unsharded block's, MPI mesh") {
  custom_style_cases::adapters_train_like_the_unsharded_block(worlds::mpi());
}

TEST_CASE("a module style written outside the library moves the module's input at its boundary, MPI mesh") {
  custom_style_cases::module_style_at_a_boundary(worlds::mpi());
}

TEST_CASE("a style written outside the library round-trips a sharded checkpoint, MPI mesh") {
  auto const world = worlds::mpi();
  auto const dir = std::filesystem::current_path() / ("custom_style_mpi_" + std::to_string(world.size()));
  if (world.rank() == 0) std::filesystem::remove_all(dir);
  world.barrier();
  custom_style_cases::checkpoint_round_trip(world, dir);
}
