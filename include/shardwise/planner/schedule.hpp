#pragma once
// The planner's pipeline schedules beside 1F1B: how much shorter ZB-H1's and ZBV's step is than 1F1B's, read off
// the schedules' own tables (sw::schedule_timeline) at a microbatch's forward, input-gradient and weight-gradient
// times on one stage.
#include <algorithm>
#include <cstddef>

#include "shardwise/pipeline/timeline.hpp"
#include "shardwise/planner/planning.hpp"

namespace shardwise::planner {

/// One microbatch through one stage, split as a zero-bubble schedule splits it.
struct microbatch_parts {
  double forward = 0;          ///< F
  double input_gradient = 0;   ///< B (with a recomputed forward, under checkpointing)
  double weight_gradient = 0;  ///< W: the Linears' weight-gradient products
};

namespace detail {
/// Microbatches the timeline runs: past 4 p the steady state adds one microbatch's work per microbatch.
constexpr std::size_t timeline_microbatches(std::size_t pp, std::size_t microbatches) {
  return std::min(microbatches, 4 * pp);
}

template <class Schedule>
double timeline_seconds(std::size_t pp, std::size_t microbatches, microbatch_parts const& t, double chunk) {
  std::size_t const simulated = timeline_microbatches(pp, microbatches);
  pipeline_times const times{t.forward * chunk, t.input_gradient * chunk, t.weight_gradient * chunk, 0};
  double const whole = t.forward + t.input_gradient + t.weight_gradient;
  return schedule_timeline(Schedule{}, static_cast<int>(pp), static_cast<int>(simulated), times).makespan +
         static_cast<double>(microbatches - simulated) * whole;
}
}  // namespace detail

/// How much of 1F1B's pipeline time `schedule` takes at pp stages and these microbatches, one microbatch through
/// one stage taking `t` (ZBV: two chunks of half of it); 1 for 1F1B.
inline double schedule_time_ratio(pipeline_choice schedule, std::size_t pp, std::size_t microbatches,
                                  microbatch_parts const& t) {
  if (schedule == pipeline_choice::one_f_one_b || pp <= 1) return 1;
  double const one = detail::timeline_seconds<OneFOneB>(pp, microbatches, t, 1);
  if (one <= 0) return 1;
  if (schedule == pipeline_choice::zero_bubble_h1)
    return detail::timeline_seconds<ZeroBubbleH1>(pp, microbatches, t, 1) / one;
  return detail::timeline_seconds<ZeroBubbleV>(pp, microbatches, t, 0.5) / one;
}

}  // namespace shardwise::planner
