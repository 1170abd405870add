#pragma once
// y = x W^T for a few rows of x (1 to 16: decoding a batch of sequences) against a large weight, of T or of bf16
// (nn/kernels/bf16_weights.hpp), widened in registers. Such a product is
// bound by reading the weight from memory, not by arithmetic (16 rows make 8 FLOP per weight byte in fp32), so
// this kernel reads each weight row once, straight from memory, against every row of x, where a GEMM would first
// pack the weight (docs/benchmarks-io.md, "Generation"):
//  - up to 4 rows: dot products of a few weight rows with each row of x, all in registers;
//  - 5 to 16 rows: x transposed once, so that each weight element, broadcast, multiplies a vector of all the rows
//    (no horizontal sums, and x read as one stream rather than one per row).
// It is compiled where the target has 256-bit or 512-bit vectors (AVX, AVX-512); elsewhere few_rows_supported is
// false and linear_forward keeps its GEMM.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "shardwise/nn/kernels/bf16.hpp"

namespace shardwise::detail {

#if defined(__AVX512F__)
inline constexpr std::size_t few_rows_vector_bytes = 64;
inline constexpr std::size_t few_rows_registers = 16;  // accumulators: half of the 32 vector registers
#elif defined(__AVX__)
inline constexpr std::size_t few_rows_vector_bytes = 32;
inline constexpr std::size_t few_rows_registers = 8;  // accumulators: half of the 16 vector registers
#else
inline constexpr std::size_t few_rows_vector_bytes = 0;
inline constexpr std::size_t few_rows_registers = 0;
#endif

/// Whether this build has the kernel, and the most rows of x it takes.
inline constexpr bool few_rows_supported = few_rows_vector_bytes > 0;
inline constexpr int few_rows_most = 16;

#if defined(__AVX__)
/// A vector of T, Bytes long (GCC's and Clang's vector extension: FMAs where the target has them).
template <class T, std::size_t Bytes>
struct few_rows_vector {
  typedef T type __attribute__((vector_size(Bytes)));
};

/// A vector of T loaded from weights of element type W: T itself, or bf16 (std::uint16_t), widened to fp32 exactly.
template <class Vector, class T, class W>
Vector few_rows_load(W const* w) {
  Vector v;
  if constexpr (std::is_same_v<W, T>) {
    std::memcpy(&v, w, sizeof(v));
  } else {
    static_assert(std::is_same_v<T, float> && std::is_same_v<W, std::uint16_t>, "bf16 weights widen to float");
    constexpr std::size_t lanes = sizeof(Vector) / sizeof(float);
    typename few_rows_vector<std::uint16_t, lanes * 2>::type half;
    std::memcpy(&half, w, sizeof(half));
    auto const wide = __builtin_convertvector(half, typename few_rows_vector<std::uint32_t, lanes * 4>::type) << 16;
    std::memcpy(&v, &wide, sizeof(v));
  }
  return v;
}

/// One cache line of weights of type W (64 bytes) widened into `to`, a register's width at a time (a wider vector
/// than the target's registers would be passed in memory, against its ABI).
template <class T, class W>
void few_rows_widen_line(W const* from, T* to) {
  constexpr std::size_t bytes = few_rows_vector_bytes;
  using piece = typename few_rows_vector<T, bytes>::type;
  constexpr std::ptrdiff_t lanes = bytes / sizeof(T), line = 64 / sizeof(W);
  for (std::ptrdiff_t k = 0; k < line; k += lanes) {
    piece const wide = few_rows_load<piece, T>(from + k);
    std::memcpy(to + k, &wide, sizeof(wide));
  }
}

/// One weight element of type W as T (bf16 widened exactly).
template <class T, class W>
T few_rows_widen(W w) {
  if constexpr (std::is_same_v<W, T>)
    return w;
  else
    return from_bf16(w);
}

/// How far ahead in a weight row the kernels ask for the cache line they will read (a software prefetch per
/// line: with several rows streaming at once, the hardware's prefetcher alone left a third of the bandwidth unused).
template <class W>
inline constexpr std::ptrdiff_t few_rows_ahead = 512 / sizeof(W);

/// sums[o * Rows + r] = x[r] . w[o] for Rows rows of x and Outs rows of w (each `in` long, w's rows `stride` apart).
template <class T, class W, int Rows, int Outs>
void few_rows_dots(T const* const* x, W const* w, std::ptrdiff_t stride, std::ptrdiff_t in, T* sums) {
  using vec = typename few_rows_vector<T, few_rows_vector_bytes>::type;
  constexpr std::ptrdiff_t lanes = few_rows_vector_bytes / sizeof(T);
  vec acc[Rows][Outs] = {};
  std::ptrdiff_t k = 0;
  for (; k + lanes <= in; k += lanes) {
    vec weight[Outs];
#pragma GCC unroll 16
    for (int o = 0; o < Outs; ++o) {
      __builtin_prefetch(w + o * stride + k + few_rows_ahead<W>, 0, 3);
      weight[o] = few_rows_load<vec, T>(w + o * stride + k);
    }
#pragma GCC unroll 16
    for (int r = 0; r < Rows; ++r) {
      vec row;
      std::memcpy(&row, x[r] + k, sizeof(vec));
#pragma GCC unroll 16
      for (int o = 0; o < Outs; ++o) acc[r][o] += row * weight[o];
    }
  }
  for (int r = 0; r < Rows; ++r)
    for (int o = 0; o < Outs; ++o) {
      T sum = 0;
      for (std::ptrdiff_t lane = 0; lane < lanes; ++lane) sum += acc[r][o][lane];
      for (std::ptrdiff_t j = k; j < in; ++j) sum += x[r][j] * few_rows_widen<T>(w[o * stride + j]);
      sums[o * Rows + r] = sum;
    }
}

/// sums[o * Rows + r] = x[r] . w[o] for Outs rows of w, from x transposed (xt[k * Rows + r] = x[r][k]). Weights of
/// another type than T are widened a cache line at a time into `line_of`, from which they are broadcast.
template <class T, class W, int Rows, int Outs>
void few_rows_broadcasts(T const* xt, W const* w, std::ptrdiff_t stride, std::ptrdiff_t in, T* sums) {
  using vec = typename few_rows_vector<T, Rows * sizeof(T)>::type;
  constexpr std::ptrdiff_t line = 64 / sizeof(W);
  constexpr bool widened = !std::is_same_v<W, T>;
  vec acc[Outs] = {};
  [[maybe_unused]] T line_of[Outs][line];
  std::ptrdiff_t k = 0;
  for (; k + line <= in; k += line) {
#pragma GCC unroll 16
    for (int o = 0; o < Outs; ++o) {
      __builtin_prefetch(w + o * stride + k + few_rows_ahead<W>, 0, 3);
      if constexpr (widened) few_rows_widen_line<T>(w + o * stride + k, line_of[o]);
    }
#pragma GCC unroll 16
    for (std::ptrdiff_t j = k; j < k + line; ++j) {
      vec column;
      std::memcpy(&column, xt + j * Rows, sizeof(vec));
#pragma GCC unroll 16
      for (int o = 0; o < Outs; ++o) {
        if constexpr (widened)
          acc[o] += column * line_of[o][j - k];
        else
          acc[o] += column * w[o * stride + j];
      }
    }
  }
  for (; k < in; ++k) {
    vec column;
    std::memcpy(&column, xt + k * Rows, sizeof(vec));
    for (int o = 0; o < Outs; ++o) acc[o] += column * few_rows_widen<T>(w[o * stride + k]);
  }
  std::memcpy(sums, acc, sizeof(acc));
}

/// y (+)= x W^T, OutsAtOnce weight rows at a time through tile(first weight row, count, sums), which writes
/// sums[o * Rows + r] for its `count` (OutsAtOnce, or 1 for the last few rows); the rows past `rows` are dropped.
template <class T, int Rows, int OutsAtOnce, class Tile, class W>
void few_rows_pass(Tile const& tile, int rows, W const* w, std::ptrdiff_t w_stride, std::ptrdiff_t outs, T* y,
                   std::ptrdiff_t y_stride, bool add) {
  T sums[Rows * OutsAtOnce];
  for (std::ptrdiff_t first = 0; first < outs; first += OutsAtOnce) {
    std::ptrdiff_t const n = std::min<std::ptrdiff_t>(OutsAtOnce, outs - first);
    if (n == OutsAtOnce)
      tile(w + first * w_stride, std::integral_constant<int, OutsAtOnce>{}, sums);
    else  // the last few weight rows, one at a time
      for (std::ptrdiff_t o = 0; o < n; ++o)
        tile(w + (first + o) * w_stride, std::integral_constant<int, 1>{}, sums + o * Rows);
    for (int r = 0; r < rows; ++r)
      for (std::ptrdiff_t o = 0; o < n; ++o) {
        T& out = y[r * y_stride + first + o];
        out = add ? out + sums[o * Rows + r] : sums[o * Rows + r];
      }
  }
}

/// The weight rows the broadcast kernel takes at once (measured best here at 8 registers of accumulators).
inline constexpr std::size_t few_rows_broadcast_registers = 8;

/// y (+)= x W^T by dot products, Rows rows of x (the rows past `rows` repeat the last one).
template <class T, int Rows, class W>
void few_rows_by_dots(T const* const* x, int rows, W const* w, std::ptrdiff_t w_stride, std::ptrdiff_t outs,
                      std::ptrdiff_t in, T* y, std::ptrdiff_t y_stride, bool add) {
  auto const tile = [&](W const* first, auto count, T* sums) {
    few_rows_dots<T, W, Rows, decltype(count)::value>(x, first, w_stride, in, sums);
  };
  few_rows_pass<T, Rows, static_cast<int>(few_rows_registers) / Rows>(tile, rows, w, w_stride, outs, y, y_stride, add);
}

/// y (+)= x W^T by broadcasts, x transposed into Rows columns (the columns past `rows` are zero).
template <class T, int Rows, class W>
void few_rows_by_broadcasts(T const* const* x, int rows, W const* w, std::ptrdiff_t w_stride, std::ptrdiff_t outs,
                            std::ptrdiff_t in, T* y, std::ptrdiff_t y_stride, bool add) {
  constexpr std::size_t registers_each = std::max<std::size_t>(1, Rows * sizeof(T) / few_rows_vector_bytes);
  std::vector<T> xt(static_cast<std::size_t>(in) * Rows, T(0));
  for (int r = 0; r < rows; ++r)
    for (std::ptrdiff_t k = 0; k < in; ++k) xt[static_cast<std::size_t>(k * Rows + r)] = x[r][k];
  auto const tile = [&](W const* first, auto count, T* sums) {
    few_rows_broadcasts<T, W, Rows, decltype(count)::value>(xt.data(), first, w_stride, in, sums);
  };
  few_rows_pass<T, Rows, static_cast<int>(few_rows_broadcast_registers / registers_each)>(tile, rows, w, w_stride, outs,
                                                                                          y, y_stride, add);
}
#endif

/// y (+)= x W^T, x [rows, in] with 1 <= rows <= few_rows_most, W [outs, in] of element type W (T, or bf16 as
/// std::uint16_t with T float), y [rows, outs], all with contiguous rows (each `*_stride` apart); add: add to what
/// y holds (a bias). Only where few_rows_supported.
template <class T, class W>
void few_rows_product(T const* x, std::ptrdiff_t x_stride, int rows, W const* w, std::ptrdiff_t w_stride,
                      std::ptrdiff_t outs, std::ptrdiff_t in, T* y, std::ptrdiff_t y_stride, bool add) {
#if defined(__AVX__)
  T const* row[16];
  for (int r = 0; r < 16; ++r) row[r] = x + std::min(r, rows - 1) * x_stride;
  if (rows == 1) return few_rows_by_dots<T, 1>(row, rows, w, w_stride, outs, in, y, y_stride, add);
  if (rows <= 2) return few_rows_by_dots<T, 2>(row, rows, w, w_stride, outs, in, y, y_stride, add);
  if (rows <= 4) return few_rows_by_dots<T, 4>(row, rows, w, w_stride, outs, in, y, y_stride, add);
  // bf16 weights, widened in registers, run out of arithmetic before memory sooner: at 5 to 8 rows dot products
  // (0.66 of the memory's rate, against 0.35 by broadcasts, here); at 9 to 16 rows either is bound by arithmetic.
  if constexpr (!std::is_same_v<W, T>)
    if (rows <= 8) return few_rows_by_dots<T, 8>(row, rows, w, w_stride, outs, in, y, y_stride, add);
  if (rows <= 8) return few_rows_by_broadcasts<T, 8>(row, rows, w, w_stride, outs, in, y, y_stride, add);
  return few_rows_by_broadcasts<T, 16>(row, rows, w, w_stride, outs, in, y, y_stride, add);
#else
  (void)x, (void)x_stride, (void)rows, (void)w, (void)w_stride, (void)outs, (void)in, (void)y, (void)y_stride,
      (void)add;
#endif
}

}  // namespace shardwise::detail
