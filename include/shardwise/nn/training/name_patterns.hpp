#pragma once
// Parameter names matched by patterns, as recipes name parameter groups ("*.bias", "*norm.weight") and the layers
// a fine-tuning touches ("layers.*.attention.wq.weight").
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace shardwise {

/// Whether a parameter name matches a pattern in which "*" stands for any run of characters (dots too):
/// "*.bias", "*norm.weight", "layers.0.*".
[[nodiscard]] constexpr bool name_matches(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++, resume = n;
    } else if (p < pattern.size() && pattern[p] == name[n]) {
      ++p, ++n;
    } else if (star != std::string_view::npos) {
      p = star + 1, n = ++resume;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') ++p;
  return p == pattern.size();
}

/// A predicate on parameter names: true when any of the patterns matches (see name_matches).
[[nodiscard]] inline std::function<bool(std::string_view)> names_matching(std::vector<std::string> patterns) {
  return [patterns = std::move(patterns)](std::string_view name) {
    for (auto const& p : patterns)
      if (name_matches(p, name)) return true;
    return false;
  };
}

}  // namespace shardwise
