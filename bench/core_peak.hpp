#pragma once
// The core's arithmetic peak, what MFU figures divide by: fp32 fused multiply-adds and, where the CPU has
// avx512_bf16, bf16 dot products, each a register-resident loop of independent chains, the best of a few runs.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>

namespace bench {

/// The core's fp32 FMA peak, FLOP/s: 16 independent chains of AVX-512 fused multiply-adds held in registers (enough to
/// fill two FMA units of 4-cycle latency), 2 FLOPs per lane.
__attribute__((target("avx512f"))) inline double fma_peak_fp32_avx512(long iterations) {
  __m512 acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_set1_ps(float(k) * 1e-3f);
  __m512 const a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-7f);
  auto const start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i)
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_fmadd_ps(acc[k], a, b);
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float sink = 0;
  for (int k = 0; k < 16; ++k) sink += _mm512_reduce_add_ps(acc[k]);
  if (sink == 1234.5f) std::fprintf(stderr, " ");  // keeps the chains alive
  return double(iterations) * 16 * 16 * 2 / seconds;
}

/// The core's bf16 dot-product peak, FLOP/s: the same with vdpbf16ps (32 bf16 products summed into 16 fp32 lanes, 64
/// FLOPs an instruction).
__attribute__((target("avx512f,avx512bf16"))) inline double dot_peak_bf16_avx512(long iterations) {
  __m512 acc[16];
  for (int k = 0; k < 16; ++k) acc[k] = _mm512_set1_ps(float(k) * 1e-3f);
  __m512bh const a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0.5f), _mm512_set1_ps(0.25f));
  auto const start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i)
    for (int k = 0; k < 16; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, a);
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  float sink = 0;
  for (int k = 0; k < 16; ++k) sink += _mm512_reduce_add_ps(acc[k]);
  if (sink == 1234.5f) std::fprintf(stderr, " ");
  return double(iterations) * 16 * 64 / seconds;
}

/// The best of `runs` of a peak loop of `iterations`, or 0 where the CPU lacks the instructions.
inline double best_peak(bool supported, double (*loop)(long), long iterations, int runs) {
  if (!supported) return 0;
  double best = 0;
  for (int r = 0; r < runs; ++r) best = std::max(best, loop(iterations));
  return best;
}

/// The core's peaks, FLOP/s (0 where the CPU lacks the instructions): the best of `runs` loops of about 0.05 s
/// each, so that a neighbour busy on a shared host for a moment does not set the figure (it did with 3).
struct core_peaks {
  double fp32 = 0;
  double bf16 = 0;
};
inline core_peaks measure_core_peaks(long iterations = 20'000'000, int runs = 10) {
  core_peaks p;
  p.fp32 = best_peak(__builtin_cpu_supports("avx512f"), fma_peak_fp32_avx512, iterations, runs);
  p.bf16 = best_peak(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"), dot_peak_bf16_avx512,
                     iterations, runs);
  return p;
}

}  // namespace bench
