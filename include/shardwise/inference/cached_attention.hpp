#pragma once
// Causal grouped-query attention with a key-value cache: the kernel a model's (or a user's) attention calls in a
// forward with the cache. It writes the new tokens' keys and values into the layer's cache at the positions the
// step reserved, then attends each new query row to every cached key up to its own position. Rows of several
// sequences come packed (cache_step); prefill gives a prompt's tokens, decode one token per sequence, and a
// sequence that is not in the step costs nothing. As causal_attention, queries go a panel of block_rows at a time,
// so a long prompt never makes a [tokens, tokens] matrix; query head h reads key-value head h / group in place.
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <concepts>
#include <cstddef>

#include "shardwise/inference/kv_cache.hpp"
#include "shardwise/nn/kernels/functional_attention.hpp"

namespace shardwise::detail {

/// The sizes of a cached attention call, checked against the step and the cache.
template <class T>
attention_shape checked_cached_attention(nn::const_matrix_ref<T> q, nn::const_matrix_ref<T> k,
                                         nn::const_matrix_ref<T> v, std::size_t head_dim, cache_step const& step,
                                         nn::kv_layer<T> const& cache, std::size_t block_rows) {
  constexpr char const* fn = "cached_attention";
  auto const rows = static_cast<Eigen::Index>(step.rows());
  if (q.rows() != rows)
    fail("shardwise::nn::", fn, ": ", q.rows(), " query rows for a step of ", rows,
         " new tokens; give one row per new token, the step's entries in order");
  auto const a = checked_attention_shape<T>(
      fn, q, k, v, sequence_lengths::every(static_cast<std::size_t>(std::max<Eigen::Index>(rows, 1))), head_dim,
      block_rows);
  if (cache.keys.cols() != k.cols() || cache.values.cols() != k.cols() || cache.keys.rows() != cache.values.rows())
    fail("shardwise::nn::", fn, ": the layer's cache holds ", cache.keys.cols(), " key columns but k has ", k.cols(),
         "; build the cache from the model's shardwise_kv_shape() after parallelize");
  std::size_t const kept = cache.window != 0 ? cache.window : step.capacity;
  for (auto const& e : step.entries)
    if (step.capacity == 0 || e.start + e.count > step.capacity ||
        static_cast<Eigen::Index>((e.sequence + 1) * kept) > cache.keys.rows())
      fail("shardwise::nn::", fn, ": sequence ", e.sequence, "'s tokens ", e.start, "..", e.start + e.count,
           " do not fit this layer's cache; take the step from kv_cache::append of this cache");
  return a;
}

/// Where one entry's attention reads its keys and values: the cache itself, position p in row p - origin (the
/// entry's new keys written there first); or, for a layer that keeps only its window, a copy of the window's
/// cached positions before the new tokens followed by the new tokens' own, which are written into the rolling
/// buffer afterwards (commit), so that a prompt longer than the window reads its own keys before they roll out.
template <class T>
struct entry_keys {
  nn::matrix<T> const* keys;
  nn::matrix<T> const* values;
  Eigen::Index origin = 0;
  nn::matrix<T> window_keys{}, window_values{};  // the rolling layer's copy

  entry_keys(nn::kv_layer<T>& cache, cache_entry const& e, std::size_t capacity, nn::const_matrix_ref<T> k,
             nn::const_matrix_ref<T> v)
      : keys(&cache.keys), values(&cache.values) {
    auto const n = static_cast<Eigen::Index>(e.count), start = static_cast<Eigen::Index>(e.start);
    if (cache.window == 0) {
      origin = -static_cast<Eigen::Index>(e.sequence * capacity);
      cache.keys.middleRows(start - origin, n) = k, cache.values.middleRows(start - origin, n) = v;
      return;
    }
    auto const w = static_cast<Eigen::Index>(cache.window), base = static_cast<Eigen::Index>(e.sequence) * w;
    origin = std::max<Eigen::Index>(0, start - (w - 1));  // the first position the first new query sees
    window_keys.resize(start + n - origin, k.cols()), window_values.resize(start + n - origin, v.cols());
    for (Eigen::Index p = origin; p < start; ++p)
      window_keys.row(p - origin) = cache.keys.row(base + p % w),
                          window_values.row(p - origin) = cache.values.row(base + p % w);
    window_keys.bottomRows(n) = k, window_values.bottomRows(n) = v;
    keys = &window_keys, values = &window_values;
  }
  /// The rolling layer keeps the new tokens' last `window` positions.
  static void commit(nn::kv_layer<T>& cache, cache_entry const& e, nn::const_matrix_ref<T> k,
                     nn::const_matrix_ref<T> v) {
    if (cache.window == 0) return;
    auto const n = static_cast<Eigen::Index>(e.count), w = static_cast<Eigen::Index>(cache.window);
    auto const base = static_cast<Eigen::Index>(e.sequence) * w, start = static_cast<Eigen::Index>(e.start);
    for (Eigen::Index i = std::max<Eigen::Index>(0, n - w); i < n; ++i)
      cache.keys.row(base + (start + i) % w) = k.row(i), cache.values.row(base + (start + i) % w) = v.row(i);
  }
};

}  // namespace shardwise::detail

namespace shardwise::nn {

/// out = softmax(q K^T / sqrt(head_dim), causal) V for the new rows of `step`, K and V the sequence's cached keys
/// and values with k and v (the new tokens' own) written into `cache` first. q, out [rows, heads * head_dim];
/// k, v [rows, kv_heads * head_dim], heads a multiple of kv_heads; RoPE, where the model has it, is applied to q
/// and k before the call, at the rows' positions (cache_step::positions). With a `window` (Mistral's
/// sliding_window), a query sees itself and the window - 1 positions before it; a cache layer that keeps only the
/// window (kv_layer::window, which must then be `window`) is read and rolled as such. Holds one [block_rows, keys]
/// panel.
template <std::floating_point T>
void cached_attention(const_matrix_ref<T> q, const_matrix_ref<T> k, const_matrix_ref<T> v, std::size_t head_dim,
                      cache_step const& step, kv_layer<T>& cache, matrix_ref<T> out,
                      std::size_t block_rows = attention_block_rows, std::size_t window = 0) {
  auto const a = detail::checked_cached_attention<T>(q, k, v, head_dim, step, cache, block_rows);
  detail::nn_check_shape("cached_attention", "out [rows, heads * head_dim]", out, q.rows(), q.cols());
  if (cache.window != 0 && cache.window != window)
    detail::fail("shardwise::nn::cached_attention: the layer's cache keeps the last ", cache.window,
                 " positions of each sequence but the attention's window is ", window,
                 " (0: none); build the cache from the model's shardwise_kv_shape(), which gives each layer's window");
  Eigen::Index const d = a.head_dim, panel_rows = static_cast<Eigen::Index>(block_rows);
  auto const w = static_cast<Eigen::Index>(window);
  T const scale = T(1) / std::sqrt(static_cast<T>(d));
  Eigen::Index longest = 0;
  for (auto const& e : step.entries) longest = std::max(longest, static_cast<Eigen::Index>(e.start + e.count));
  if (w > 0) longest = std::min(longest, panel_rows + w - 1);
  matrix<T> panel(std::min(panel_rows, std::max<Eigen::Index>(q.rows(), 1)), longest);
  Eigen::Matrix<T, Eigen::Dynamic, 1> inverse_sum(panel.rows());
  Eigen::Index row = 0;
  for (auto const& e : step.entries) {
    auto const n = static_cast<Eigen::Index>(e.count), start = static_cast<Eigen::Index>(e.start);
    detail::entry_keys<T> const kv(cache, e, step.capacity, k.middleRows(row, n), v.middleRows(row, n));
    for (Eigen::Index h = 0; h < a.heads; ++h) {
      Eigen::Index const g = h / a.group();
      for (Eigen::Index first = 0; first < n; first += panel_rows) {
        Eigen::Index const rows = std::min(panel_rows, n - first), at = start + first;  // the panel's first position
        auto const keys = detail::keys_of_panel(at, rows, w);
        auto p = panel.topLeftCorner(rows, keys.count);
        p.noalias() = q.block(row + first, h * d, rows, d) *
                      kv.keys->block(keys.from - kv.origin, g * d, keys.count, d).transpose();
        for (Eigen::Index r = 0; r < rows; ++r) {
          auto const columns = detail::columns_seen(at, r, keys.from, w);
          auto seen = p.row(r).segment(columns.begin, columns.count);
          T const top = seen.maxCoeff();
          seen = ((seen.array() - top) * scale).exp().matrix();
          inverse_sum(r) = T(1) / seen.sum();
        }
        detail::mask_unseen(p, at, keys.from, w);
        auto o = out.block(row + first, h * d, rows, d);
        o.noalias() = p * kv.values->block(keys.from - kv.origin, g * d, keys.count, d);
        o.array().colwise() *= inverse_sum.head(rows).array();
      }
    }
    detail::entry_keys<T>::commit(cache, e, k.middleRows(row, n), v.middleRows(row, n));
    row += n;
  }
}

}  // namespace shardwise::nn
