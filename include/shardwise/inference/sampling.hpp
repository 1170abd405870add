#pragma once
// How sw::generate picks the next token from a row of logits: greedy (argmax), or transformers' sampling rule —
// logits divided by the temperature, then top-k, then top-p (nucleus) filtering, then a draw from the softmax of
// what is left. The draw is an argument (a uniform number in [0, 1)), so that every rank of a tp group, given the
// same logits and the same draw, picks the same token, and a test can give the rule and a reference the same draws.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <span>
#include <vector>

#include "shardwise/core/error.hpp"

namespace shardwise {

/// The sampling settings of generate (transformers' generate arguments of the same names).
struct sampling {
  double temperature = 0;  ///< 0: greedy (the most likely token); else the logits are divided by it and sampled.
  std::int64_t top_k = 0;  ///< Keep only the top_k most likely tokens (ties at the k-th kept too); 0: all.
  double top_p = 1.0;      ///< Keep the smallest set of most likely tokens whose probability reaches top_p; in (0, 1].
};

/// Throws, naming the setting and the fix, for settings no rule has: a negative or non-finite temperature, a
/// negative top_k, a top_p outside (0, 1].
inline void check_sampling(sampling const& s) {
  if (!(s.temperature >= 0) || !std::isfinite(s.temperature))
    detail::fail("shardwise::sampling: temperature ", s.temperature,
                 " is not a finite number >= 0; give 0 for greedy decoding or a positive temperature");
  if (s.top_k < 0) detail::fail("shardwise::sampling: top_k ", s.top_k, " is negative; give 0 (off) or a count");
  if (!(s.top_p > 0 && s.top_p <= 1))
    detail::fail("shardwise::sampling: top_p ", s.top_p, " is outside (0, 1]; give 1 to turn it off");
}

namespace detail {

/// Scores after the temperature and the top-k and top-p filters (removed tokens: -infinity), as transformers'
/// TemperatureLogitsWarper, TopKLogitsWarper and TopPLogitsWarper compute them, in double.
template <class T>
std::vector<double> filtered_scores(std::span<const T> logits, sampling const& s) {
  constexpr double removed = -std::numeric_limits<double>::infinity();
  std::vector<double> x(logits.size());
  for (std::size_t i = 0; i < x.size(); ++i) x[i] = static_cast<double>(logits[i]) / s.temperature;
  if (s.top_k > 0 && static_cast<std::size_t>(s.top_k) < x.size()) {
    std::vector<double> sorted = x;
    auto const kth = sorted.begin() + (s.top_k - 1);
    std::nth_element(sorted.begin(), kth, sorted.end(), std::greater<>());
    double const threshold = *kth;
    for (double& v : x)
      if (v < threshold) v = removed;
  }
  if (s.top_p < 1) {
    std::vector<std::size_t> order(x.size());
    std::iota(order.begin(), order.end(), std::size_t{0});
    std::sort(order.begin(), order.end(),  // ties in vocabulary order
              [&](std::size_t a, std::size_t b) { return x[a] < x[b] || (x[a] == x[b] && a < b); });
    double const top = x[order.back()];
    double total = 0;
    for (double v : x) total += std::exp(v - top);
    double cumulative = 0;
    for (std::size_t j = 0; j + 1 < order.size(); ++j) {  // the most likely token always stays
      cumulative += std::exp(x[order[j]] - top) / total;
      if (cumulative <= 1 - s.top_p) x[order[j]] = removed;
    }
  }
  return x;
}

}  // namespace detail

/// The next token from one row of logits (the real vocabulary's columns): the first most likely token when
/// s.temperature is 0; else the first token whose cumulative probability (in vocabulary order, after the
/// filters) exceeds `draw` in [0, 1).
template <class T>
std::int64_t sample_token(std::span<const T> logits, sampling const& s, double draw) {
  if (logits.empty()) detail::fail("shardwise::sample_token: no logits; give the row of the whole vocabulary");
  if (s.temperature == 0)
    return static_cast<std::int64_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<double> const x = detail::filtered_scores(logits, s);
  double const top = *std::max_element(x.begin(), x.end());
  double total = 0;
  for (double v : x) total += std::exp(v - top);
  double const target = draw * total;
  double cumulative = 0;
  std::size_t last_kept = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    if (x[i] == -std::numeric_limits<double>::infinity()) continue;
    last_kept = i;
    cumulative += std::exp(x[i] - top);
    if (cumulative > target) return static_cast<std::int64_t>(i);
  }
  return static_cast<std::int64_t>(last_kept);  // rounding left the draw past the end: the last kept token
}

/// The draws of generate: a uniform number in [0, 1) from 53 bits of a std::mt19937_64 seeded with `seed`,
/// the same sequence on every platform (the engine is specified to the bit).
class token_draws {
 public:
  /// Draws from `seed`.
  explicit token_draws(std::uint64_t seed) : engine_(seed) {}
  /// The next draw.
  double next() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

}  // namespace shardwise
