#pragma once
// A notice while a collective waits long: a rank that is slow cannot be told from one that is stuck, so the
// timeout (mesh/timeout.hpp) stays the verdict, but a wait past a minute is worth a line on stderr naming who
// has not come and where the others wait, instead of 30 silent minutes. SHARDWISE_WAIT_NOTICE (seconds) sets
// when the first notice comes, 60 s by default (0: none); it repeats every five times that (5 minutes).
// Only the lowest rank of the axis that is waiting prints, so a stall gives one line per axis, not one per rank.
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/compiled_once.hpp"
#include "shardwise/mesh/timeout.hpp"

namespace shardwise::detail {

/// When a wait's notices come: first after `first`, then every `every`; `first` zero: never.
struct wait_notice_times {
  timeout_duration first{};
  timeout_duration every{};
  [[nodiscard]] bool on() const { return first.count() > 0; }
};

/// SHARDWISE_WAIT_NOTICE in seconds (fractions allowed; 0 turns the notices off) if set, else 60 s; the
/// repeats come every five times that. Read where a run or communicator starts, so a bad value raises there and
/// never inside a collective's wait.
SHARDWISE_DETAIL_RUNTIME_ENTRY wait_notice_times default_wait_notice();
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY wait_notice_times default_wait_notice() {
  char const* text = std::getenv("SHARDWISE_WAIT_NOTICE");
  double seconds = 60;
  if (text != nullptr && *text != '\0') {
    char* end = nullptr;
    seconds = std::strtod(text, &end);
    if (end == text || *end != '\0' || !(seconds >= 0) || seconds > 1e9)
      fail("shardwise: SHARDWISE_WAIT_NOTICE=\"", text,
           "\" is not a number of seconds; set it to when a long wait in a collective is first reported, such as "
           "60 or 2.5 (0 turns the notices off), or unset it for the default of 60");
  }
  auto const first = timeout_duration(static_cast<long long>(seconds * 1000.0 + 0.5));
  return {first, 5 * first};
}
#endif

/// The k-th notice of a wait that began at `start` is due at start + first + k * every.
inline std::chrono::steady_clock::time_point wait_notice_due(std::chrono::steady_clock::time_point start,
                                                             wait_notice_times const& times, int k) {
  if (!times.on()) return std::chrono::steady_clock::time_point::max();
  return start + times.first + k * times.every;
}

/// "all_reduce<float>([4], sum) at train.cpp:42 as call #3".
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string call_text(call_record const& call);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string call_text(call_record const& call) {
  std::ostringstream out;
  out << call << " as call #" << call.sequence;
  return out.str();
}
#endif

/// "rank 0", "ranks 0, 2, 3".
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string ranks_text(std::vector<int> const& ranks);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string ranks_text(std::vector<int> const& ranks) {
  std::ostringstream out;
  out << (ranks.size() == 1 ? "rank " : "ranks ");
  for (std::size_t i = 0; i < ranks.size(); ++i) out << (i ? ", " : "") << ranks[i];
  return out.str();
}
#endif

/// The k-th notice of ranks `waiting` of mesh axis `axis`, which wait in `call` ("all_reduce<float>([4], sum)
/// at train.cpp:42 as call #3") for their peers; `missing` says who has not come and where it is.
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string wait_notice_text(std::string_view axis, std::vector<int> const& waiting,
                                                            std::string_view call, std::string_view missing,
                                                            wait_notice_times const& times, int k,
                                                            timeout_duration limit);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string wait_notice_text(std::string_view axis, std::vector<int> const& waiting,
                                                            std::string_view call, std::string_view missing,
                                                            wait_notice_times const& times, int k,
                                                            timeout_duration limit) {
  std::ostringstream out;
  out << "shardwise: still waiting: " << ranks_text(waiting) << " of mesh axis \"" << axis
      << (waiting.size() == 1 ? "\" has" : "\" have") << " waited " << seconds_text(times.first + k * times.every)
      << " in " << call << " for " << (waiting.size() == 1 ? "its" : "their") << " peers: " << missing
      << ". A slow rank cannot be told from a stuck one, so the wait goes on until the timeout (" << seconds_text(limit)
      << ", SHARDWISE_TIMEOUT); this notice repeats every " << seconds_text(times.every)
      << " (SHARDWISE_WAIT_NOTICE=seconds sets the first, 0 turns them off)";
  return out.str();
}
#endif

}  // namespace shardwise::detail
