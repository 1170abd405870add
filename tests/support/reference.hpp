#pragma once
// An independent reference for the tests: a row-major array of doubles with naive index loops. It shares no
// code with shardwise (no boxes, no chunk helpers), so what it computes is a second opinion, not a copy.
#include <doctest/doctest.h>

#include <cmath>
#include <cstddef>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

namespace ref {

struct Array {
  std::vector<std::size_t> shape;
  std::vector<double> values;

  static Array zeros(std::vector<std::size_t> shape) {
    std::size_t n = 1;
    for (auto s : shape) n *= s;
    return {std::move(shape), std::vector<double>(n, 0.0)};
  }
  std::size_t size() const { return values.size(); }
  std::size_t flat(std::vector<std::size_t> const& index) const {
    std::size_t f = 0;
    for (std::size_t i = 0; i < shape.size(); ++i) f = f * shape[i] + index[i];
    return f;
  }
  std::vector<std::size_t> unflat(std::size_t f) const {
    std::vector<std::size_t> index(shape.size());
    for (std::size_t i = shape.size(); i-- > 0;) {
      index[i] = f % shape[i];
      f /= shape[i];
    }
    return index;
  }
  double& at(std::vector<std::size_t> const& index) { return values[flat(index)]; }
  double at(std::vector<std::size_t> const& index) const { return values[flat(index)]; }
};

/// Values that stay exact in float and bfloat16 under sums of a few ranks: small integers.
inline Array pattern(std::vector<std::size_t> shape, int seed, bool small = false) {
  Array a = Array::zeros(std::move(shape));
  for (std::size_t f = 0; f < a.size(); ++f)
    a.values[f] = small ? double((f * 7 + static_cast<std::size_t>(seed) * 3) % 13) - 6.0
                        : double((f * 37 + static_cast<std::size_t>(seed) * 101) % 2001) - 1000.0;
  return a;
}

/// torch.chunk, written from its definition: pieces of ceil(n / k), the last ones shorter or missing.
inline std::vector<std::size_t> torch_chunk_sizes(std::size_t n, std::size_t k) {
  std::size_t const c = k == 0 ? 0 : (n + k - 1) / k;
  std::vector<std::size_t> sizes;
  std::size_t left = n;
  for (std::size_t i = 0; i < k; ++i) {
    std::size_t const s = left < c ? left : c;
    sizes.push_back(s);
    left -= s;
  }
  return sizes;
}

inline Array slice(Array const& a, std::size_t dim, std::size_t start, std::size_t length) {
  auto shape = a.shape;
  shape[dim] = length;
  Array out = Array::zeros(shape);
  for (std::size_t f = 0; f < out.size(); ++f) {
    auto index = out.unflat(f);
    index[dim] += start;
    out.values[f] = a.at(index);
  }
  return out;
}

/// Piece `which` of `k` along `dim`, sized like torch.chunk.
inline Array chunk(Array const& a, std::size_t dim, std::size_t k, std::size_t which) {
  auto sizes = torch_chunk_sizes(a.shape[dim], k);
  std::size_t start = 0;
  for (std::size_t i = 0; i < which; ++i) start += sizes[i];
  return slice(a, dim, start, sizes[which]);
}

inline Array concat(std::vector<Array> const& parts, std::size_t dim) {
  auto shape = parts.at(0).shape;
  shape[dim] = 0;
  for (auto const& p : parts) shape[dim] += p.shape[dim];
  Array out = Array::zeros(shape);
  std::size_t start = 0;
  for (auto const& p : parts) {
    for (std::size_t f = 0; f < p.size(); ++f) {
      auto index = p.unflat(f);
      index[dim] += start;
      out.at(index) = p.values[f];
    }
    start += p.shape[dim];
  }
  return out;
}

inline Array combine(std::vector<Array> const& parts, std::function<double(double, double)> const& op) {
  Array out = parts.at(0);
  for (std::size_t q = 1; q < parts.size(); ++q)
    for (std::size_t f = 0; f < out.size(); ++f) out.values[f] = op(out.values[f], parts[q].values[f]);
  return out;
}

inline std::string describe(std::vector<std::size_t> const& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  out << ']';
  return out.str();
}

/// Largest |a - b| / max(1, |b|); shapes must match.
inline double relative_error(Array const& a, Array const& b) {
  if (a.shape != b.shape) return INFINITY;
  double worst = 0;
  for (std::size_t f = 0; f < a.size(); ++f)
    worst = std::max(worst, std::abs(a.values[f] - b.values[f]) / std::max(1.0, std::abs(b.values[f])));
  return worst;
}

}  // namespace ref
