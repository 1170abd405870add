// Measures what `shardwise plan` predicts step times from, on this machine, and prints it as a machine file
// (tools/machines/this_machine.json's format), one BLAS thread per rank as the benchmarks run:
//  - gemm_flops and gemm_half_rate_tokens: a Linear's forward and backward GEMMs (dim 1024 -> 2816, fp32) at
//    64 to 2048 tokens, fitted to rate(tokens) = gemm_flops x tokens / (tokens + gemm_half_rate_tokens): small
//    microbatches run the GEMM kernels below their peak;
//  - memory_bandwidth: sw::AdamW's update of 16 M parameters, bytes read and written per second;
//  - each axis' link on the thread mesh at 2 ranks (wire bytes as the planner counts them): the latency of a
//    4 KiB all-reduce; tp's bandwidth at the activations' size (a 1 MiB all-reduce), dp's at the parameters' (a
//    64 MiB all-gather), pp's (a 1 MiB send and receive, as a pipeline stage's boundary);
//  - on standard error, the core's peak: fp32 fused multiply-adds and, where the CPU has them, bf16 dot products
//    (avx512_bf16) and bf16 tile products (AMX), each a register-resident loop (what MFU figures divide by).
// Every figure is the best of several runs: the machine's rate, not its noise. The measurements are the planner's
// own (shardwise/planner/calibrate.hpp, which `shardwise plan --machine calibrate` runs shorter).
//
//   bench_machine [--smoke]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <shardwise/planner/calibrate.hpp>
#include <tuple>
#include <vector>

#include "core_peak.hpp"

extern "C" void openblas_set_num_threads(int);

namespace sw = shardwise;

int main(int argc, char** argv) {
  openblas_set_num_threads(1);
  bool const smoke = argc > 1 && !std::strcmp(argv[1], "--smoke");
  int const runs = smoke ? 1 : 7;
  std::vector<std::pair<double, double>> rates;
  std::fprintf(stderr, "tokens  GFLOP/s (Linear 1024 -> 2816, forward and backward)\n");
  for (long t : {64, 128, 256, 512, 1024, 2048}) {
    if (smoke && t > 128) break;
    rates.emplace_back(double(t), sw::planner::linear_gemm_rate(t, runs));
    std::fprintf(stderr, "%6ld  %.1f\n", t, rates.back().second / 1e9);
  }
  sw::planner::machine m;
  std::tie(m.gemm_flops, m.gemm_half_rate_tokens) = sw::planner::fit_gemm_curve(rates);
  if (m.gemm_half_rate_tokens == 0)
    std::fprintf(stderr, "the GEMM rates do not fall with fewer tokens: the best one, flat\n");
  long const iterations = smoke ? 1000 : 20'000'000;
  bench::core_peaks const peaks = bench::measure_core_peaks(iterations, runs);
  double const fp32_peak = peaks.fp32, bf16_peak = peaks.bf16;
  std::fprintf(stderr,
               "peak per core: fp32 FMA %.1f GFLOP/s, bf16 dot %.1f GFLOP/s, bf16 AMX tiles %.1f GFLOP/s (0: no "
               "such instructions)\n",
               fp32_peak / 1e9, bf16_peak / 1e9, peaks.bf16_amx / 1e9);
  std::fprintf(
      stderr, "the Linear's best rate / the fp32 peak: %.2f\n",
      fp32_peak > 0
          ? std::max_element(rates.begin(), rates.end(), [](auto a, auto b) { return a.second < b.second; })->second /
                fp32_peak
          : 0.0);
  m.memory_bandwidth = sw::planner::adamw_memory_bandwidth(runs);
  sw::planner::measure_thread_links(m, smoke ? 1 : 20);
  std::time_t const now = std::time(nullptr);
  char measured[32];  // UTC: shardwise plan prints it, so a stale file shows its age
  std::strftime(measured, sizeof measured, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  m.name = "this machine, thread mesh: measured by bench_machine", m.measured = measured;
  std::printf("%s", sw::planner::machine_json(m).c_str());
  return 0;
}
