#pragma once
// Finding a desync in seconds instead of at the timeout. A rank that has waited in a collective for a short,
// fixed time (desync_first_check) learns what its peers are doing — on the thread mesh from shared memory, on
// MPI by asking them on a side channel — and works out whether the waits can ever complete: a wait completes
// only if every rank it waits for may still arrive, and a rank may arrive unless it waits in a wait that
// cannot complete or has returned for good. Ranks that compute, or do not answer, may arrive: a slow peer is
// never reported. A cycle of waits (two ranks that cross sub-mesh axes, a rank that makes one call more than
// its peers and then waits on another axis) is therefore found, and every rank in it raises the same message,
// naming each rank's call. The timeout stays for peers that are merely slow.
//
// A verdict poisons the collectives it was found in: it goes to every rank of them (desync_recipients), not only
// to the ranks the check had a report from, since a rank that was slow to report (a loaded machine) waits in
// them just the same and would otherwise stay waiting, or find a new cycle with a peer that has moved on and
// raise another message. A rank takes it at once if it waits, or at its next collective; until it has taken it,
// the check counts it as one that may arrive, so that its old wait is not mistaken for a new desync.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/mesh/call.hpp"
#include "shardwise/mesh/compiled_once.hpp"
#include "shardwise/mesh/timeout.hpp"

namespace shardwise::detail {

/// After how long in one wait a rank first looks for a desync, and how often it looks again: seconds, so that
/// a desync is named long before the timeout; never more than a fraction of the timeout, so that a short
/// timeout still names it.
inline std::chrono::milliseconds desync_first_check(timeout_duration limit) {
  return std::min<std::chrono::milliseconds>(std::chrono::milliseconds(2000), limit / 3);
}
/// See desync_first_check.
inline std::chrono::milliseconds desync_recheck(timeout_duration limit) {
  return std::min<std::chrono::milliseconds>(std::chrono::milliseconds(1000), limit / 6);
}

/// What one rank is doing, as the desync check sees it: plain bytes, so that MPI can carry it.
struct rank_activity {
  enum class state : std::uint8_t {
    unknown,   ///< No report (it computes, or did not answer): it may arrive anywhere.
    waiting,   ///< In a collective, waiting for the ranks `waits_for`.
    finished,  ///< Returned from its function (on MPI: waiting to finalize): it makes no more calls.
  };
  static constexpr std::size_t most_named = 16;  ///< Ranks waited for that a report carries.
  state what = state::unknown;
  std::uint32_t waiting_for = 0;                     ///< How many of waits_for count.
  std::array<std::int32_t, most_named> waits_for{};  ///< World ranks this rank waits for (the first 16).
  std::uint32_t member_count = 0;                    ///< How many of members count.
  std::array<std::int32_t, most_named> members{};    ///< World ranks of the wait's axis (the first 16).
  std::array<char, 48> axis{};                       ///< The mesh axis of the wait.
  std::array<char, 200> call{};                      ///< "all_reduce<float>([4], sum) at train.cpp:42 as call #3".

  /// Equal reports: the same wait, for the same ranks.
  friend bool operator==(rank_activity const& a, rank_activity const& b) {
    return a.what == b.what && a.waiting_for == b.waiting_for && a.waits_for == b.waits_for &&
           text_of(a.axis) == text_of(b.axis) && text_of(a.call) == text_of(b.call);
  }
};

/// The report of a rank waiting on mesh axis `axis` (whose world ranks are `members`) in `call` (null: in
/// `what`, with no record) for the world ranks `waits_for`.
SHARDWISE_DETAIL_RUNTIME_ENTRY rank_activity waiting_activity(std::string_view axis, call_record const* call,
                                                              char const* what, std::vector<int> const& waits_for,
                                                              std::vector<int> const& members);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY rank_activity waiting_activity(std::string_view axis, call_record const* call,
                                                              char const* what, std::vector<int> const& waits_for,
                                                              std::vector<int> const& members) {
  rank_activity a;
  a.what = rank_activity::state::waiting;
  for (int r : waits_for)
    if (a.waiting_for < rank_activity::most_named) a.waits_for[a.waiting_for++] = r;
  for (int r : members)
    if (a.member_count < rank_activity::most_named) a.members[a.member_count++] = r;
  copy_tail(axis, a.axis);
  std::ostringstream text;
  if (call != nullptr)
    text << *call << " as call #" << call->sequence;
  else
    text << what;
  std::string const described = text.str();
  std::size_t const kept = std::min(described.size(), a.call.size() - 1);
  std::copy_n(described.begin(), kept, a.call.begin());
  return a;
}
#endif

/// The world ranks whose waits can never complete, given each rank's report (a rank without one may arrive):
/// every rank but those that may still arrive, found as the least fixed point from the ranks that may.
SHARDWISE_DETAIL_RUNTIME_ENTRY std::vector<int> stuck_ranks(std::map<int, rank_activity> const& reports);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY std::vector<int> stuck_ranks(std::map<int, rank_activity> const& reports) {
  std::map<int, bool> may_arrive;
  for (auto const& [r, a] : reports) may_arrive[r] = a.what == rank_activity::state::unknown;
  auto const may = [&](int r) {
    auto const found = may_arrive.find(r);
    return found == may_arrive.end() || found->second;  // no report: it may arrive
  };
  for (bool grew = true; grew;) {
    grew = false;
    for (auto const& [r, a] : reports) {
      if (may(r) || a.what != rank_activity::state::waiting) continue;
      bool all = true;
      for (std::uint32_t i = 0; i < a.waiting_for && all; ++i) all = may(a.waits_for[i]);
      if (all) may_arrive[r] = true, grew = true;
    }
  }
  std::vector<int> stuck;
  for (auto const& [r, a] : reports)
    if (!may(r)) stuck.push_back(r);
  return stuck;
}
#endif

/// The error every rank of a deadlock raises: each stuck rank's call, in world rank order.
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string desync_message(std::map<int, rank_activity> const& reports,
                                                          std::vector<int> const& stuck);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY std::string desync_message(std::map<int, rank_activity> const& reports,
                                                          std::vector<int> const& stuck) {
  std::ostringstream out;
  out << "shardwise: the ranks wait for each other in calls that can never complete (found in seconds, before "
         "the timeout): ";
  for (std::size_t i = 0; i < stuck.size(); ++i) {
    rank_activity const& a = reports.at(stuck[i]);
    out << (i ? "; " : "") << "world rank " << stuck[i];
    if (a.what == rank_activity::state::finished) {
      out << " has returned from its function and makes no more calls";
      continue;
    }
    out << " waits in " << text_of(a.call) << " on mesh axis \"" << text_of(a.axis) << "\" for world rank"
        << (a.waiting_for > 1 ? "s " : " ");
    for (std::uint32_t k = 0; k < a.waiting_for; ++k) out << (k ? ", " : "") << a.waits_for[k];
  }
  out << ". Every rank of a mesh axis must make the same collective calls on it in the same order (a rank that "
         "calls on another axis first, or calls once more than its peers, waits for them forever)";
  return out.str();
}
#endif

/// The world ranks a verdict on `stuck` goes to: the stuck ranks and every rank of the axes they wait on (those
/// they wait for, and those that arrived with them), whatever the reports said of them; not ranks that finished.
SHARDWISE_DETAIL_RUNTIME_ENTRY std::vector<int> desync_recipients(std::map<int, rank_activity> const& reports,
                                                                  std::vector<int> const& stuck);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY std::vector<int> desync_recipients(std::map<int, rank_activity> const& reports,
                                                                  std::vector<int> const& stuck) {
  std::vector<int> to(stuck);
  for (int r : stuck) {
    rank_activity const& a = reports.at(r);
    to.insert(to.end(), a.waits_for.begin(), a.waits_for.begin() + a.waiting_for);
    to.insert(to.end(), a.members.begin(), a.members.begin() + a.member_count);
  }
  std::sort(to.begin(), to.end());
  to.erase(std::unique(to.begin(), to.end()), to.end());
  std::erase_if(to, [&](int r) {
    auto const found = reports.find(r);
    return found != reports.end() && found->second.what == rank_activity::state::finished;
  });
  return to;
}
#endif

/// Tests only: holds that make a rank behave as one the scheduler holds back would. Each rank has its own, in
/// its mesh's state (desync_test_holds_of(world)).
struct desync_test_holds {
  /// Until this time, the rank leaves a desync verdict it was sent untaken (and, on MPI, answers and checks as
  /// usual).
  std::chrono::steady_clock::time_point verdicts_until{};
  /// MPI only: until this time, the process neither answers the check's questions nor checks nor takes a verdict.
  std::chrono::steady_clock::time_point quiet_until{};
};
/// Whether a test hold (a time of desync_test_holds) is on now.
inline bool test_held(std::chrono::steady_clock::time_point const& until) {
  return until != std::chrono::steady_clock::time_point{} && std::chrono::steady_clock::now() < until;
}

}  // namespace shardwise::detail
