#pragma once
// OpenBLAS (built with DYNAMIC_ARCH, as Debian's) picks its kernels by the CPU's model number when it loads. A CPU
// newer than the build (Debian 12's OpenBLAS 0.3.21 on an Emerald Rapids Xeon, family 6 model 207) gets its generic
// Prescott (SSE3) kernels, and every product runs about 5x slower with no word said. The environment variable
// OPENBLAS_CORETYPE, read when OpenBLAS loads, names the kernels instead; the library can only say so, once.
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>

// OpenBLAS's own (openblas_config.h); weak, so that a program linking another BLAS, or none, still links.
extern "C" char* openblas_get_corename(void) __attribute__((weak));

namespace shardwise::detail {

/// What the CPU's vector units can run, for choosing BLAS kernels.
struct cpu_vectors {
  bool avx2_fma = false;  // AVX2 and FMA: OpenBLAS's Haswell kernels
  bool avx512 = false;    // AVX-512 F, BW, DQ and VL: its SkylakeX kernels
};

inline cpu_vectors this_cpu_vectors() {
  cpu_vectors v;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  v.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  v.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
#endif
  return v;
}

/// The advice for OpenBLAS running the kernels of `core` on a CPU with `cpu`'s vectors: empty where the kernels
/// use AVX2 or better, or the CPU has nothing better; else the message that names the fix.
inline std::string openblas_kernel_advice(std::string_view core, cpu_vectors cpu) {
  // OpenBLAS's x86-64 cores whose kernels have AVX2 and FMA (its names, as openblas_get_corename spells them).
  for (std::string_view fast : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids", "Excavator"})
    if (core == fast) return {};
  if (!cpu.avx2_fma) return {};
  std::string_view const fix = cpu.avx512 ? "SkylakeX" : "Haswell";
  std::string_view const has = cpu.avx512 ? "AVX-512" : "AVX2 and FMA";
  return std::string("shardwise: OpenBLAS does not know this CPU and runs its ") + std::string(core) +
         " kernels, without the " + std::string(has) +
         " the CPU has (fp32 products about 5x slower on an Emerald Rapids Xeon); start the program with "
         "OPENBLAS_CORETYPE=" +
         std::string(fix) + " in its environment\n";
}

/// Says once, on standard error, that OpenBLAS runs kernels below the CPU's (nothing where the program has another
/// BLAS, or none).
inline void check_blas_kernels_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (openblas_get_corename == nullptr) return;
    char const* core = openblas_get_corename();
    if (core == nullptr) return;
    std::string const advice = openblas_kernel_advice(core, this_cpu_vectors());
    if (!advice.empty()) std::fputs(advice.c_str(), stderr);
  });
}

}  // namespace shardwise::detail
