// Checkpoints under FSDP on the MPI mesh (CTest runs this under mpiexec -n 2 and 4): saved under one dp x tp and
// loaded under another, from the sharded folder and from its consolidated file (cases/fsdp_checkpoint_cases.hpp).
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "cases/fsdp_checkpoint_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("FSDP checkpoints load under another dp x tp and consolidate, MPI mesh") {
  auto const world = worlds::mpi();
  // One folder per world size, which every process names alike.
  auto const root = std::filesystem::current_path() / ("fsdp_checkpoint_mpi_" + std::to_string(world.size()));
  fsdp_checkpoint_cases::check_all(world, root);
}
