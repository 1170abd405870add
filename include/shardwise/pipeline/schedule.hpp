#pragma once
// Pipeline schedules that are proven before they run. checked_schedule<Schedule, stages, microbatches> runs
// the schedule's whole action table through the checker (check.hpp) at compile time: a schedule that would hang
// (with unbounded sends, or at the in_flight_per_peer it declares) or mismatch a message does not compile, and the
// diagnostic names the rule, the rank and the step. With counts known only at run time, check_schedule runs the same
// check and throws with the same words.
#include <concepts>
#include <string>

#include "shardwise/core/error.hpp"
#include "shardwise/core/show.hpp"
#include "shardwise/pipeline/action.hpp"
#include "shardwise/pipeline/check.hpp"
#include "shardwise/pipeline/schedules.hpp"

// Each rule's words, once: in checked_schedule's static_asserts (which take only literals) and in
// check_schedule's run-time error.
#define SHARDWISE_SCHEDULE_RULE_NONE "the schedule passes"
#define SHARDWISE_SCHEDULE_RULE_COUNTS_NOT_SUPPORTED                                                      \
  "the schedule cannot run this many microbatches on this many stages (Interleaved1F1B needs a multiple " \
  "of the stages); give counts its supports(stages, microbatches) accepts, or use OneFOneB, which runs "  \
  "any"
#define SHARDWISE_SCHEDULE_RULE_MALFORMED_ACTION                                                       \
  "an action names a microbatch or chunk out of range, or a peer that does not hold the neighbouring " \
  "stage; chunk c of rank r is stage c * stages + r: send activations to the next stage's rank and "   \
  "gradients to the previous one's"
#define SHARDWISE_SCHEDULE_RULE_SEND_BEFORE_COMPUTE                                                 \
  "a send comes before the forward (activation) or backward (gradient) that computes it; move the " \
  "send after that computation"
#define SHARDWISE_SCHEDULE_RULE_FORWARD_BEFORE_INPUT                                                  \
  "a forward runs before its activation was received; put recv_activation from the previous stage's " \
  "rank before it"
#define SHARDWISE_SCHEDULE_RULE_BACKWARD_BEFORE_FORWARD \
  "a backward runs before its own forward; run forward(microbatch, chunk) first"
#define SHARDWISE_SCHEDULE_RULE_BACKWARD_BEFORE_GRADIENT                                            \
  "a backward runs before its gradient was received; put recv_gradient from the next stage's rank " \
  "before it (only the last stage needs none)"
#define SHARDWISE_SCHEDULE_RULE_DONE_TWICE \
  "a forward, backward (or its half) or receive of one microbatch and chunk happens twice; do each once"
#define SHARDWISE_SCHEDULE_RULE_RECEIVE_OUT_OF_ORDER                                              \
  "a receive expects another microbatch or chunk than the next message from that rank (messages " \
  "arrive in the order they were sent); receive in the order the peer sends"
#define SHARDWISE_SCHEDULE_RULE_DEADLOCK                                                               \
  "the schedule deadlocks: every unfinished rank waits in a receive whose message is sent only after " \
  "a wait of its own, or never; move the peer's send before the receive it feeds"
#define SHARDWISE_SCHEDULE_RULE_NEVER_COMPUTED                                                          \
  "a forward or backward (or backward_weight) of a microbatch never runs; every rank runs each of its " \
  "chunks' forward and backward (or backward_input and backward_weight) once per microbatch"
#define SHARDWISE_SCHEDULE_RULE_MESSAGE_NEVER_RECEIVED \
  "a message is sent but never received; add the matching receive on the peer, or drop the send"
#define SHARDWISE_SCHEDULE_RULE_WEIGHT_BEFORE_INPUT_GRADIENT                                                    \
  "a backward_weight (W) runs before the backward_input (B) of its microbatch and chunk; W uses what B keeps: " \
  "put it after that B"
#define SHARDWISE_SCHEDULE_RULE_DEADLOCK_AT_BOUND                                                                 \
  "the schedule deadlocks once a peer may hold only in_flight_per_peer unreceived messages: this send waits for " \
  "its peer to receive, while the peer waits on this rank; receive earlier on the peer, send later, or raise "    \
  "in_flight_per_peer (sw::bounded<Schedule, K>)"

namespace shardwise {

namespace detail {

/// Incomplete on purpose: the diagnostic shows the schedule and the counts it cannot run.
template <class Schedule, int Stages, int Microbatches>
struct schedule_cannot_run;

/// Incomplete on purpose: the diagnostic shows where the schedule breaks a rule: the rank, the step (index in
/// that rank's list) and the action there (kind, microbatch, chunk, peer).
template <int Rank, int Step, action_kind Kind, int Microbatch, int Chunk, int Peer>
struct schedule_fails_at;

template <class S, int Stages, int Microbatches>
constexpr schedule_check static_schedule_check() {
  if constexpr (pipeline_schedule<S>)
    return simulate_schedule(S{}, Stages, Microbatches);
  else
    return {};  // checked_schedule's concept asserts report it
}

/// Named in decltype before checked_schedule's static_asserts (see mesh.hpp's show_if_named_twice).
template <class S, int Stages, int Microbatches, schedule_rule Rule, int Rank, int Step, action_kind Kind,
          int Microbatch, int Chunk, int Peer>
constexpr auto show_schedule_failure() {
  if constexpr (Rule == schedule_rule::counts_not_supported) {
    using offending_counts [[maybe_unused]] = decltype(show_incomplete<schedule_cannot_run<S, Stages, Microbatches>>());
  } else if constexpr (Rule != schedule_rule::none) {
    using offending_step [[maybe_unused]] =
        decltype(show_incomplete<schedule_fails_at<Rank, Step, Kind, Microbatch, Chunk, Peer>>());
  }
  return true;
}

template <class S>
constexpr int static_chunks_per_rank() {
  if constexpr (schedule_chunks<S>)
    return static_cast<int>(S::chunks_per_rank);
  else
    return 1;  // checked_schedule's concept asserts report it
}

/// The rule's words, as checked_schedule's static_asserts say them (kept equal to those literals).
[[nodiscard]] inline char const* rule_words(schedule_rule rule) {
  switch (rule) {
    case schedule_rule::none:
      return SHARDWISE_SCHEDULE_RULE_NONE;
    case schedule_rule::counts_not_supported:
      return SHARDWISE_SCHEDULE_RULE_COUNTS_NOT_SUPPORTED;
    case schedule_rule::malformed_action:
      return SHARDWISE_SCHEDULE_RULE_MALFORMED_ACTION;
    case schedule_rule::send_before_compute:
      return SHARDWISE_SCHEDULE_RULE_SEND_BEFORE_COMPUTE;
    case schedule_rule::forward_before_input:
      return SHARDWISE_SCHEDULE_RULE_FORWARD_BEFORE_INPUT;
    case schedule_rule::backward_before_forward:
      return SHARDWISE_SCHEDULE_RULE_BACKWARD_BEFORE_FORWARD;
    case schedule_rule::backward_before_gradient:
      return SHARDWISE_SCHEDULE_RULE_BACKWARD_BEFORE_GRADIENT;
    case schedule_rule::done_twice:
      return SHARDWISE_SCHEDULE_RULE_DONE_TWICE;
    case schedule_rule::receive_out_of_order:
      return SHARDWISE_SCHEDULE_RULE_RECEIVE_OUT_OF_ORDER;
    case schedule_rule::deadlock:
      return SHARDWISE_SCHEDULE_RULE_DEADLOCK;
    case schedule_rule::never_computed:
      return SHARDWISE_SCHEDULE_RULE_NEVER_COMPUTED;
    case schedule_rule::message_never_received:
      return SHARDWISE_SCHEDULE_RULE_MESSAGE_NEVER_RECEIVED;
    case schedule_rule::weight_before_input_gradient:
      return SHARDWISE_SCHEDULE_RULE_WEIGHT_BEFORE_INPUT_GRADIENT;
    case schedule_rule::deadlock_at_bound:
      return SHARDWISE_SCHEDULE_RULE_DEADLOCK_AT_BOUND;
  }
  return "unknown rule";
}

/// "rank 0, step 1, recv_gradient(microbatch 0, chunk 0) from rank 1: <the rule's words>".
[[nodiscard]] inline std::string describe(schedule_check const& check, int stages, int microbatches) {
  if (check.rule == schedule_rule::counts_not_supported)
    return concat(microbatches, " microbatches on ", stages, " stages: ", rule_words(check.rule));
  std::string where = concat("rank ", check.rank);
  if (check.rule == schedule_rule::never_computed)
    where += ", after its last step";
  else if (check.step >= 0)
    where += concat(", step ", check.step);
  std::string found = check.rule == schedule_rule::receive_out_of_order
                          ? concat(" (the next message on its channel is ", describe(check.arrived), ")")
                          : std::string();
  return concat(where, ", ", describe(check.action), found, ": ", rule_words(check.rule));
}

}  // namespace detail

/// Throws sw::error when `schedule` with these counts breaks a rule: "shardwise::check_schedule: rank R, step S,
/// <action>: <the rule and its fix>" (the words of checked_schedule's static_asserts). Every rank computes the
/// same tables, so every rank throws, before any data moves.
template <pipeline_schedule S>
void check_schedule(S const& schedule, int stages, int microbatches) {
  auto const check = simulate_schedule(schedule, stages, microbatches);
  if (!check.ok()) detail::fail("shardwise::check_schedule: ", detail::describe(check, stages, microbatches));
}

/// A schedule with static counts, proven at compile time: instantiating it static_asserts that every rank's
/// action table runs to its end, every send meets its receive in order and no rank waits forever. A broken
/// schedule's diagnostic says the rule and the fix, and shows detail::schedule_fails_at<rank, step, action...>
/// (or schedule_cannot_run<Schedule, stages, microbatches> for counts it refuses).
template <class Schedule, int Stages, int Microbatches>
struct checked_schedule {
  static_assert(schedule_chunks<Schedule>,
                "shardwise::checked_schedule: the schedule needs `static constexpr int chunks_per_rank` (1 unless "
                "interleaved)");
  static_assert(schedule_counts<Schedule>,
                "shardwise::checked_schedule: the schedule needs `static constexpr bool supports(int stages, int "
                "microbatches)`");
  static_assert(schedule_actions<Schedule>,
                "shardwise::checked_schedule: the schedule needs `static constexpr pipeline_actions actions(int "
                "rank, int stages, int microbatches)`");
  static_assert(std::default_initializable<Schedule>,
                "shardwise::checked_schedule: the schedule must be default-constructible");

  /// The check's result; ok() in any program that compiles.
  static constexpr schedule_check result = detail::static_schedule_check<Schedule, Stages, Microbatches>();

 private:
  using failure_shown [[maybe_unused]] =
      decltype(detail::show_schedule_failure<Schedule, Stages, Microbatches, result.rule, result.rank, result.step,
                                             result.action.kind, result.action.microbatch, result.action.chunk,
                                             result.action.peer>());
  static_assert(result.rule != schedule_rule::counts_not_supported,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_COUNTS_NOT_SUPPORTED);
  static_assert(result.rule != schedule_rule::malformed_action,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_MALFORMED_ACTION);
  static_assert(result.rule != schedule_rule::send_before_compute,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_SEND_BEFORE_COMPUTE);
  static_assert(result.rule != schedule_rule::forward_before_input,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_FORWARD_BEFORE_INPUT);
  static_assert(result.rule != schedule_rule::backward_before_forward,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_BACKWARD_BEFORE_FORWARD);
  static_assert(result.rule != schedule_rule::backward_before_gradient,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_BACKWARD_BEFORE_GRADIENT);
  static_assert(result.rule != schedule_rule::done_twice,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_DONE_TWICE);
  static_assert(result.rule != schedule_rule::receive_out_of_order,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_RECEIVE_OUT_OF_ORDER);
  static_assert(result.rule != schedule_rule::deadlock,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_DEADLOCK);
  static_assert(result.rule != schedule_rule::never_computed,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_NEVER_COMPUTED);
  static_assert(result.rule != schedule_rule::message_never_received,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_MESSAGE_NEVER_RECEIVED);
  static_assert(result.rule != schedule_rule::weight_before_input_gradient,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_WEIGHT_BEFORE_INPUT_GRADIENT);
  static_assert(result.rule != schedule_rule::deadlock_at_bound,
                "shardwise::checked_schedule: " SHARDWISE_SCHEDULE_RULE_DEADLOCK_AT_BOUND);

 public:
  /// The schedule proven.
  using schedule = Schedule;
  /// The counts proven.
  static constexpr pipeline_shape shape{Stages, detail::static_chunks_per_rank<Schedule>(), Microbatches,
                                        placement_of<Schedule>()};

  /// Rank `rank`'s actions, as proven (built again: a table cannot outlive the constant evaluation).
  static constexpr pipeline_actions actions(int rank) { return Schedule{}.actions(rank, Stages, Microbatches); }
};

}  // namespace shardwise
