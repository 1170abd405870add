#pragma once
// The machine a benchmark's planner column is for (`--machine`): a machine file (bench_machine's output, or
// `shardwise plan --machine calibrate`'s cache), or `calibrate`: this machine measured now, in this process, as a
// program that plans at its first use would (planner::calibrate_machine, a few seconds). Measured in the benchmark's
// own build, it sees the rates of the code that runs the steps, and the host's speed of the same minutes.
#include <cstdio>
#include <cstring>
#include <shardwise/planner/calibrate.hpp>
#include <shardwise/planner/machine_file.hpp>

extern "C" void openblas_set_num_threads(int);

/// `value` of --machine: "calibrate", or a machine file's path. Calibrating prints the figures on stdout.
inline shardwise::planner::machine machine_from_flag(char const* value) {
  if (std::strcmp(value, "calibrate") != 0) return shardwise::planner::read_machine(value);
  openblas_set_num_threads(1);  // as a rank runs
  auto const m = shardwise::planner::calibrate_machine();
  std::printf(
      "# machine calibrated in this process: gemm_flops %.3g, half rate at %.1f tokens, memory %.3g B/s, "
      "tp %.3g B/s, dp %.3g B/s, pp %.3g B/s\n",
      m.gemm_flops, m.gemm_half_rate_tokens, m.memory_bandwidth, m.tp.bandwidth, m.dp.bandwidth, m.pp.bandwidth);
  return m;
}
