#pragma once
// How long a schedule's step takes, read off its action tables: every rank runs its table in order, a forward, B
// or W takes its time, a whole backward B + W, a receive waits for its message (sent, plus the message's time on
// the link), a send costs nothing on the sender (buffered). The makespan and each rank's idle share (the bubble)
// follow, for any schedule, so the bubble of 1F1B ((p - 1) / (m + p - 1) with a backward twice a forward) and of
// ZB-H1 ((p - 1) / (3m + p - 1) with F = B = W) come out of the same arithmetic as a table of your own. constexpr.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "shardwise/pipeline/action.hpp"
#include "shardwise/pipeline/schedules.hpp"

namespace shardwise {

/// One microbatch through one chunk: how long each part takes, and a message between two ranks.
struct pipeline_times {
  double forward = 1;          ///< F
  double input_gradient = 1;   ///< B; a whole backward takes B + W
  double weight_gradient = 1;  ///< W
  double message = 0;          ///< from a send until its receive on another rank can complete
};

/// A step's timeline: when the last rank finished, and how long the ranks computed.
struct pipeline_timeline {
  double makespan = 0;         ///< the step's time: the latest rank's end
  std::vector<double> busy{};  ///< each rank's compute time
  bool complete = true;        ///< false when the table stopped (a table the check refuses)

  /// The mean over the ranks of their idle share of the makespan.
  [[nodiscard]] constexpr double bubble() const {
    double idle = 0;
    for (double b : busy) idle += 1 - b / makespan;
    return busy.empty() || makespan == 0 ? 0 : idle / static_cast<double>(busy.size());
  }
};

namespace detail {

constexpr double compute_time(action_kind kind, pipeline_times const& t) {
  if (kind == action_kind::forward) return t.forward;
  if (kind == action_kind::backward) return t.input_gradient + t.weight_gradient;
  if (kind == action_kind::backward_input) return t.input_gradient;
  if (kind == action_kind::backward_weight) return t.weight_gradient;
  return 0;
}

/// The arrival times of what one rank sent another, of one kind, in order; `next`: the first not received.
struct timed_channel {
  std::vector<double> arrivals;
  std::size_t next = 0;
};

}  // namespace detail

/// The timeline of an action table (element r: rank r's actions) of `shape`, as the check runs it (ranks in
/// turn, each as far as its receives let it), with every action at its earliest time.
constexpr pipeline_timeline simulate_timeline(std::vector<pipeline_actions> const& table, pipeline_shape shape,
                                              pipeline_times const& times) {
  auto const ranks = static_cast<std::size_t>(shape.stages);
  pipeline_timeline timeline{0, std::vector<double>(ranks, 0.0), true};
  std::vector<double> clock(ranks, 0.0);
  std::vector<std::size_t> next(ranks, 0);
  std::vector<detail::timed_channel> channels(ranks * ranks * 2);
  auto const channel = [&](int from, int to, action_kind kind) -> detail::timed_channel& {
    std::size_t const gradient = detail::carries_gradient(kind) ? 1 : 0;
    return channels[(static_cast<std::size_t>(from) * ranks + static_cast<std::size_t>(to)) * 2 + gradient];
  };
  for (bool moved = true; moved;) {
    moved = false;
    for (std::size_t r = 0; r < ranks; ++r)
      for (; next[r] < table[r].size(); ++next[r], moved = true) {
        auto const& a = table[r][next[r]];
        int const rank = static_cast<int>(r);
        if (detail::is_send(a.kind)) {
          channel(rank, a.peer, a.kind).arrivals.push_back(clock[r] + (a.peer == rank ? 0 : times.message));
        } else if (detail::is_receive(a.kind)) {
          auto& from = channel(a.peer, rank, a.kind);
          if (from.next == from.arrivals.size()) break;
          clock[r] = std::max(clock[r], from.arrivals[from.next++]);
        } else {
          double const t = detail::compute_time(a.kind, times);
          clock[r] += t, timeline.busy[r] += t;
        }
      }
  }
  for (std::size_t r = 0; r < ranks; ++r) {
    timeline.makespan = std::max(timeline.makespan, clock[r]);
    timeline.complete = timeline.complete && next[r] == table[r].size();
  }
  return timeline;
}

/// The timeline of `schedule` with these counts (simulate_timeline of its tables).
template <pipeline_schedule S>
constexpr pipeline_timeline schedule_timeline(S const& schedule, int stages, int microbatches,
                                              pipeline_times const& times) {
  return simulate_timeline(action_table(schedule, stages, microbatches), shape_of<S>(stages, microbatches), times);
}

}  // namespace shardwise
