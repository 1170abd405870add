// The Llama model trained sharded on the thread mesh: 50 steps, loss curve and final parameters equal to the
// unsharded run (fp32, 1e-4 relative) for TP 2, TP 4, TP 2 with sequence parallelism, dp 2 x tp 2 and
// dp 2 x tp 2 with ZeRO-1.
#include <doctest/doctest.h>

#include "cases/llama_cases.hpp"

namespace {
constexpr int steps = 50;
}

TEST_CASE("Llama: sharded training equals the unsharded run, thread mesh") {
  auto const c = llama_cases::small_config();
  llama_cases::Run serial;
  shardwise::run_threads(
      1, [&](auto& world) { serial = llama_cases::train<shardwise::serial_plan>(world, 1, steps, false, c); });
  CHECK(serial.losses.back() < serial.losses.front());  // it learns
  auto check = [&](char const* name, int ranks, int dp, bool zero1, auto plan_tag) {
    using Plan = typename decltype(plan_tag)::type;
    INFO(name);
    shardwise::run_threads(ranks, [&](auto& world) {
      auto const run = llama_cases::train<Plan>(world, dp, steps, zero1, c);
      if (world.rank() == 0) llama_cases::check_same_run(run, serial);
    });
  };
  using tp_only = std::type_identity<shardwise::models::llama_plan<false>>;
  using sequence_parallel = std::type_identity<shardwise::models::llama_plan<true>>;
  check("TP 2", 2, 1, false, tp_only{});
  check("TP 4", 4, 1, false, tp_only{});
  check("TP 2 with sequence parallelism", 2, 1, false, sequence_parallel{});
  check("dp 2 x tp 2", 4, 2, false, sequence_parallel{});
  check("dp 2 x tp 2 with ZeRO-1", 4, 2, true, sequence_parallel{});
}
