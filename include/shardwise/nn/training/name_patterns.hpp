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

namespace detail {
/// The length of the pattern token at `p` matching the character `c` (a character, or a class "[qkv]"), or 0 if it
/// does not match. A '[' without its ']' is a character.
constexpr std::size_t token_matches(std::string_view pattern, std::size_t p, char c) {
  if (pattern[p] == '[') {
    std::size_t const close = pattern.find(']', p + 1);
    if (close != std::string_view::npos) {
      std::string_view const set = pattern.substr(p + 1, close - p - 1);
      return set.find(c) != std::string_view::npos ? close - p + 1 : 0;
    }
  }
  return pattern[p] == c ? 1 : 0;
}
}  // namespace detail

/// Whether a name matches a pattern in which "*" stands for any run of characters (dots too) and "[qkv]" for one
/// of the characters listed: "*.bias", "*norm.weight", "layers.0.*", "layers.*.attention.w[qkvo]".
[[nodiscard]] constexpr bool name_matches(std::string_view pattern, std::string_view name) {
  std::size_t p = 0, n = 0, star = std::string_view::npos, resume = 0;
  while (n < name.size()) {
    std::size_t const token = p < pattern.size() && pattern[p] != '*' ? detail::token_matches(pattern, p, name[n]) : 0;
    if (p < pattern.size() && pattern[p] == '*') {
      star = p++, resume = n;
    } else if (token > 0) {
      p += token, ++n;
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
