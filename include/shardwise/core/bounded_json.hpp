#pragma once
// JSON from outside, parsed within bounds: its nesting is measured in one pass over the text before the parser
// sees it, so a hostile file of nested brackets costs neither stack (printing or walking a deep value recurses)
// nor time, and the parse itself runs without a callback, in time linear in the text.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace shardwise::detail {

/// The nesting of arrays and objects the files shardwise reads may have: a config's or an index's few levels,
/// with room to spare.
inline constexpr std::size_t max_json_depth = 64;

/// The deepest nesting of arrays and objects in `text`, counting no further than `stop_above` + 1; brackets
/// inside strings (and escaped quotes) do not count. Unbalanced text is the parser's to refuse.
inline std::size_t json_depth(std::string_view text, std::size_t stop_above) {
  std::size_t depth = 0, deepest = 0;
  bool in_string = false, escaped = false;
  for (char const c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > deepest) deepest = depth;
      if (deepest > stop_above) return deepest;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return deepest;
}

/// Parses `text` as JSON nested at most `max_depth` deep. On text nested deeper, too_deep(depth) is called; on
/// text that is not JSON, not_json(reason); both must throw.
template <class TooDeep, class NotJson>
nlohmann::json parse_bounded_json(std::string_view text, std::size_t max_depth, TooDeep&& too_deep,
                                  NotJson&& not_json) {
  if (std::size_t const depth = json_depth(text, max_depth); depth > max_depth) too_deep(depth);
  try {
    return nlohmann::json::parse(text.begin(), text.end());
  } catch (nlohmann::json::exception const& e) {
    not_json(std::string(e.what()));
  }
  return {};  // not reached: not_json throws
}

}  // namespace shardwise::detail
