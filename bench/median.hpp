#pragma once
// The median the benchmarks report over repeated timings.
#include <algorithm>
#include <vector>

namespace bench {

/// The middle value (for an even count, the upper of the two middle ones); 0 for none.
inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

}  // namespace bench
