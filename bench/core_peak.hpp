#pragma once
// The core's arithmetic peak, what MFU figures divide by: fp32 fused multiply-adds, and where the CPU has them bf16
// dot products (avx512_bf16) and bf16 tile products (AMX), each a register-resident loop of independent chains, the
// best of a few runs.
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
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

/// Whether the CPU has AMX bf16 tiles and Linux lets this process use them (a process asks for the tiles' state
/// once: arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA).
inline bool amx_bf16_usable() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  bool const tile = (d >> 24) & 1u, bf16 = (d >> 22) & 1u;
  constexpr long arch_req_xcomp_perm = 0x1023, xfeature_xtiledata = 18;
  return tile && bf16 && syscall(SYS_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0;
}

/// The core's AMX bf16 peak, FLOP/s: tdpbf16ps on four independent accumulator tiles of 16 x 16 fp32, each
/// instruction a [16 x 32] by [32 x 16] bf16 product (16,384 FLOPs), its sources held in tiles.
__attribute__((target("amx-tile,amx-bf16"))) inline double tile_peak_bf16_amx(long iterations) {
  struct alignas(64) {
    std::uint8_t palette = 1, start_row = 0, reserved[14] = {};
    std::uint16_t bytes_per_row[16] = {};
    std::uint8_t rows[16] = {};
  } config;
  for (int t = 0; t < 8; ++t) config.bytes_per_row[t] = 64, config.rows[t] = 16;
  alignas(64) static std::uint16_t const source[16 * 32] = {};  // zeros: the rate does not depend on the values
  _tile_loadconfig(&config);
  _tile_zero(0);  // the intrinsics are asm statements, one each
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, source, 64);
  _tile_loadd(5, source, 64);
  _tile_loadd(6, source, 64);
  _tile_loadd(7, source, 64);
  iterations /= 16;  // a tile product is 16 times an AVX-512 dot's work, and about as many cycles
  auto const start = std::chrono::steady_clock::now();
  for (long i = 0; i < iterations; ++i) {
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(1, 4, 6);
    _tile_dpbf16ps(2, 5, 7);
    _tile_dpbf16ps(3, 6, 7);
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  _tile_release();
  return double(iterations) * 4 * 16 * 16 * 32 * 2 / seconds;
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
  double bf16 = 0;      // avx512_bf16's dot products
  double bf16_amx = 0;  // AMX's tile products
  /// The bf16 peak the core has: AMX's where it has tiles, else the dot products'.
  [[nodiscard]] double bf16_best() const { return std::max(bf16, bf16_amx); }
};
inline core_peaks measure_core_peaks(long iterations = 20'000'000, int runs = 10) {
  core_peaks p;
  p.fp32 = best_peak(__builtin_cpu_supports("avx512f"), fma_peak_fp32_avx512, iterations, runs);
  p.bf16 = best_peak(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16"), dot_peak_bf16_avx512,
                     iterations, runs);
  p.bf16_amx = best_peak(amx_bf16_usable(), tile_peak_bf16_amx, iterations, runs);
  return p;
}

}  // namespace bench
