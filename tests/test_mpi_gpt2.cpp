// The GPT-2 training cases on the MPI mesh, each against the unsharded run computed on every rank: at 2 ranks
// TP 2 with and without sequence parallelism; at 4 ranks TP 4 and dp 2 x tp 2 with ZeRO-1. AdamW parameter
// groups and clipping on every step, as on threads (test_gpt2.cpp). With the sequences cut over cp: cp 2 by ring and
// by all-to-all at 2 ranks; cp 2 x tp 2 with sequence parallelism and dp 2 x cp 2 at 4.
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

TEST_CASE("GPT-2 with its sequences cut over cp equals the unsharded run, MPI mesh") {
  int const steps = llama_cases::steps();
  auto const world = worlds::mpi();
  auto c = gpt2_cases::small_config();
  c.sequence = 9;  // over cp 2: 5 tokens on rank 0, 4 on rank 1
  auto const serial = gpt2_cases::train<shardwise::serial_plan>(shardwise::serial_world(), 1, steps, false, c);
  using tp_only = shardwise::models::gpt2_plan<false>;
  using sequence_parallel = shardwise::models::gpt2_plan<true>;
  auto const ring = shardwise::context_method::ring;
  float const clip = gpt2_cases::max_grad_norm;
  auto check = [&](gpt2_cases::Run const& run) { gpt2_cases::check_same_training(run, serial); };
  if (world.size() == 2) {
    INFO("cp 2, ring");
    check(gpt2_cases::train<tp_only>(world, 1, steps, false, c, clip, {2, ring}));
    INFO("cp 2, all-to-all");
    check(gpt2_cases::train<tp_only>(world, 1, steps, false, c, clip, {2, shardwise::context_method::all_to_all}));
  } else if (world.size() == 4) {
    INFO("cp 2 x tp 2 with sequence parallelism, ring");
    check(gpt2_cases::train<sequence_parallel>(world, 1, steps, false, c, clip, {2, ring}));
    INFO("dp 2 x cp 2, ring");
    check(gpt2_cases::train<tp_only>(world, 2, steps, false, c, clip, {2, ring}));
  } else {
    FAIL("run with mpiexec -n 2 or -n 4");
  }
}
