// Pipeline steps on the MPI mesh (CTest runs this under mpiexec -n 1, 2, 4) against the unsharded run
// (cases/pipeline_cases.hpp): activations and gradients cross between processes with non-blocking sends.
#include <doctest/doctest.h>

#include <shardwise/mesh/mpi.hpp>

#include "cases/pipeline_cases.hpp"

TEST_CASE("run_pipeline_step: GPipe, 1F1B and interleaved 1F1B equal the unsharded run, MPI mesh") {
  auto const world = shardwise::mpi_world();
  auto const pp = shardwise::make_mesh<"pp">(world, {world.size()});
  pipeline_cases::check_all(pp);
  pipeline_cases::check_refusal(pp);
}
