// The GPT-2 training cases on the MPI mesh, each against the unsharded run computed on every rank: at 2 ranks
// TP 2 with and without sequence parallelism; at 4 ranks TP 4 and dp 2 x tp 2 with ZeRO-1. AdamW parameter
// groups and clipping on every step, as on threads (test_gpt2.cpp).
#include <doctest/doctest.h>

#include "cases/gpt2_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("GPT-2: sharded training equals the unsharded run, MPI mesh") {
  int const steps = llama_cases::steps();
  auto const world = worlds::mpi();
  auto const c = gpt2_cases::small_config();
  auto const serial = gpt2_cases::train<shardwise::serial_plan>(shardwise::serial_world(), 1, steps, false, c);
  using tp_only = shardwise::models::gpt2_plan<false>;
  using sequence_parallel = shardwise::models::gpt2_plan<true>;
  auto check = [&](gpt2_cases::Run const& run) { gpt2_cases::check_same_training(run, serial); };
  if (world.size() == 2) {
    INFO("TP 2");
    check(gpt2_cases::train<tp_only>(world, 1, steps, false, c));
    INFO("TP 2 with sequence parallelism");
    check(gpt2_cases::train<sequence_parallel>(world, 1, steps, false, c));
  } else if (world.size() == 4) {
    INFO("TP 4");
    check(gpt2_cases::train<tp_only>(world, 1, steps, false, c));
    INFO("TP 4 with sequence parallelism");
    check(gpt2_cases::train<sequence_parallel>(world, 1, steps, false, c));
    INFO("dp 2 x tp 2 with ZeRO-1");
    check(gpt2_cases::train<sequence_parallel>(world, 2, steps, true, c));
  } else {
    FAIL("run with mpiexec -n 2 or -n 4");
  }
}
