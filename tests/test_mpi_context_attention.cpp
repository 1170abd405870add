// Attention across context-parallel ranks on the MPI mesh (CTest runs this under mpiexec -n 2 and 4), against
// single-rank attention (cases/context_attention_cases.hpp).
#include <doctest/doctest.h>

#include "cases/context_attention_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("ring and all-to-all attention across cp ranks equal whole-sequence attention, MPI mesh") {
  auto const world = worlds::mpi();
  context_attention_cases::check_all(world);
  context_attention_cases::check_refusals(world);
}
