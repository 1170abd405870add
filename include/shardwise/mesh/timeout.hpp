#pragma once
// How long a rank waits for its peers in a collective before it raises: 30 minutes by default (PyTorch's
// default for CPU process groups), SHARDWISE_TIMEOUT (seconds) in the environment, or set_timeout in code.
#include <chrono>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/compiled_once.hpp"

namespace shardwise {

/// The time a rank may wait in one collective for its peers; see detail::default_timeout.
using timeout_duration = std::chrono::milliseconds;

namespace detail {

/// SHARDWISE_TIMEOUT in seconds (fractions allowed) if set, else 30 minutes.
SHARDWISE_DETAIL_RUNTIME_ENTRY timeout_duration default_timeout();
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY timeout_duration default_timeout() {
  char const* text = std::getenv("SHARDWISE_TIMEOUT");
  if (text == nullptr || *text == '\0') return std::chrono::minutes(30);
  char* end = nullptr;
  double const seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || seconds > 1e9)
    fail("shardwise: SHARDWISE_TIMEOUT=\"", text,
         "\" is not a number of seconds; set it to a positive number such as 600 or 2.5, or unset it for the "
         "default of 1800");
  return timeout_duration(static_cast<long long>(seconds * 1000.0 + 0.5));
}
#endif

/// "2.5 s".
inline std::string seconds_text(timeout_duration d) {
  std::ostringstream out;
  out << static_cast<double>(d.count()) / 1000.0 << " s";
  return out.str();
}

/// The error of a rank that waited `limit` in `what` on mesh axis `axis`; `missing` says who did not come.
[[noreturn]] SHARDWISE_DETAIL_RUNTIME_ENTRY void collective_timed_out(int rank, std::string_view axis,
                                                                      timeout_duration limit, std::string_view what,
                                                                      std::string const& missing);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
[[noreturn]] SHARDWISE_DETAIL_RUNTIME_ENTRY void collective_timed_out(int rank, std::string_view axis,
                                                                      timeout_duration limit, std::string_view what,
                                                                      std::string const& missing) {
  fail("shardwise: rank ", rank, " of mesh axis \"", axis, "\" waited ", seconds_text(limit), " in ", what,
       " for its peers: ", missing,
       ". Every rank must make the same collective calls in the same order; raise the limit with "
       "SHARDWISE_TIMEOUT (seconds) or set_timeout if a rank is just slow");
}
#endif

/// The error of a recv that waited `limit` for a message from `source`.
[[noreturn]] SHARDWISE_DETAIL_RUNTIME_ENTRY void recv_timed_out(int rank, std::string_view axis, timeout_duration limit,
                                                                int source, int tag);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
[[noreturn]] SHARDWISE_DETAIL_RUNTIME_ENTRY void recv_timed_out(int rank, std::string_view axis, timeout_duration limit,
                                                                int source, int tag) {
  fail("shardwise::recv on mesh axis \"", axis, "\": rank ", rank, " waited ", seconds_text(limit),
       " for a message from rank ", source, " (tag ", tag,
       "); every recv needs a matching send. Raise the limit with SHARDWISE_TIMEOUT (seconds) or set_timeout if "
       "the sender is just slow");
}
#endif

}  // namespace detail
}  // namespace shardwise
