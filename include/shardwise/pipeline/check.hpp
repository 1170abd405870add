#pragma once
// Runs every rank's action table against the others, as the ranks would, before any data moves: sends are
// buffered, a receive waits for its message, messages between two ranks arrive in the order they were sent.
// With a bound K on the messages in flight per peer (a schedule's in_flight_per_peer), a send to another rank
// waits once more than K of this rank's messages to that peer are unreceived: K eager slots, K = 0 a rendezvous.
// A schedule passes when every rank reaches its end with each forward and backward done once, after its inputs
// (a backward split in two: its input-gradient half B, then its weight-gradient half W), and every message received
// in the order it was sent. constexpr, so checked_schedule runs it at compile time.
#include <cstddef>
#include <vector>

#include "shardwise/pipeline/action.hpp"
#include "shardwise/pipeline/schedules.hpp"

namespace shardwise {

/// The rule a schedule breaks (none: it passes).
enum class schedule_rule : unsigned char {
  none,                          ///< no rule broken: the schedule passes
  counts_not_supported,          ///< the schedule's supports(stages, microbatches) is false, or a count is below 1
  malformed_action,              ///< microbatch or chunk out of range, or a peer that does not hold the neighbour stage
  send_before_compute,           ///< an activation sent before its forward, or a gradient before its backward
  forward_before_input,          ///< a forward (not of stage 0) before its activation was received
  backward_before_forward,       ///< a backward before its own forward
  backward_before_gradient,      ///< a backward (not of the last stage) before its gradient was received
  done_twice,                    ///< a forward, backward or receive of one microbatch and chunk done twice
  receive_out_of_order,          ///< a receive expects another microbatch or chunk than the next message brings
  deadlock,                      ///< every unfinished rank waits in a receive
  never_computed,                ///< a forward or backward of some microbatch and stage never runs
  message_never_received,        ///< a message is sent and never received
  weight_before_input_gradient,  ///< a backward_weight (W) before the backward_input (B) of the same microbatch
  deadlock_at_bound,  ///< with a bounded number of unreceived messages per peer, ranks wait in sends and receives
};

/// in_flight_per_peer when a schedule declares none: a send never waits (MPI_Isend with a copy, the thread
/// mailbox), however many of its messages the peer has not received yet.
inline constexpr int unbounded_in_flight = -1;

/// What simulate_table found: ok(), or the rule broken, where (rank, step: the index in that rank's list) and
/// the action. For a deadlock, the lowest waiting rank and the receive it waits in; for never_computed, step is
/// the length of the rank's list; for counts_not_supported, rank and step are -1.
struct schedule_check {
  schedule_rule rule = schedule_rule::none;  ///< the rule broken, none when the schedule passes
  int rank = -1;                             ///< the rank whose action breaks it
  int step = -1;                             ///< the index of that action in the rank's list
  pipeline_action action{};                  ///< the action that breaks the rule
  pipeline_action arrived{};                 ///< receive_out_of_order: the send whose message came instead

  /// Whether the schedule passed.
  [[nodiscard]] constexpr bool ok() const { return rule == schedule_rule::none; }
};

namespace detail {

/// One (stage, microbatch)'s progress in the simulation.
struct stage_progress {
  bool input_received = false;
  bool forward_done = false;
  bool gradient_received = false;
  bool input_gradient_done = false;  // B, or the whole backward
  bool weight_done = false;          // W, or the whole backward
};

/// A message on its way: the send that made it, by which rank at which step.
struct pipeline_message {
  pipeline_action send;
  int sender = 0;
  int step = 0;
};

/// What one rank sent one other rank, of one kind, in order; `next` is the first not yet received.
struct pipeline_channel {
  std::vector<pipeline_message> messages;
  std::size_t next = 0;
};

/// Runs the ranks round-robin, each as far as it can go, until all are done or none can move.
class schedule_simulator {
 public:
  constexpr schedule_simulator(std::vector<pipeline_actions> const& table, pipeline_shape shape, int in_flight_per_peer)
      : table_(table),
        shape_(shape),
        bound_(in_flight_per_peer),
        next_step_(table.size(), 0),
        waiting_in_send_(table.size(), 0),
        progress_(static_cast<std::size_t>(shape.model_stages() * shape.microbatches)),
        channels_(static_cast<std::size_t>(shape.stages * shape.stages * 2)) {}

  constexpr schedule_check run() {
    for (long before = -1; before != events_;) {
      before = events_;
      for (int rank = 0; rank < shape_.stages; ++rank)
        if (auto broken = advance(rank); !broken.ok()) return broken;
    }
    for (int rank = 0; rank < shape_.stages; ++rank)
      if (waiting_in_send_[rank])
        return {schedule_rule::deadlock_at_bound, rank, next_step_[rank], table_[rank][next_step_[rank]], {}};
    for (int rank = 0; rank < shape_.stages; ++rank)
      if (next_step_[rank] < length(rank))
        return {schedule_rule::deadlock, rank, next_step_[rank], table_[rank][next_step_[rank]], {}};
    if (auto missing = first_never_computed(); !missing.ok()) return missing;
    return first_never_received();
  }

 private:
  // Runs `rank` until its end, a receive whose message has not come, a send over the bound, or a broken rule.
  // A send over the bound has posted its message: the rank stays at it until the peer has received enough.
  constexpr schedule_check advance(int rank) {
    auto const& actions = table_[rank];
    for (int& step = next_step_[rank]; step < length(rank); ++step) {
      auto const& action = actions[step];
      if (waiting_in_send_[rank]) {
        if (over_bound(rank, action.peer)) break;
        waiting_in_send_[rank] = 0;
        ++events_;
        continue;
      }
      if (!well_formed(rank, action)) return {schedule_rule::malformed_action, rank, step, action, {}};
      if (is_receive(action.kind) && !message_waiting(rank, action)) break;
      if (auto rule = execute(rank, step, action); rule != schedule_rule::none)
        return {rule, rank, step, action, arrived_};
      ++events_;
      if (is_send(action.kind) && action.peer != rank && over_bound(rank, action.peer)) {
        waiting_in_send_[rank] = 1;
        break;
      }
    }
    return {};
  }

  // Whether more of `rank`'s messages to `peer` are unreceived than the bound allows (sends to itself are moves).
  constexpr bool over_bound(int rank, int peer) const {
    if (bound_ < 0) return false;
    auto const& activations = channel(rank, peer, action_kind::send_activation);
    auto const& gradients = channel(rank, peer, action_kind::send_gradient);
    auto const unreceived = activations.messages.size() - activations.next + gradients.messages.size() - gradients.next;
    return unreceived > static_cast<std::size_t>(bound_);
  }

  constexpr bool well_formed(int rank, pipeline_action const& action) const {
    if (action.microbatch < 0 || action.microbatch >= shape_.microbatches) return false;
    if (action.chunk < 0 || action.chunk >= shape_.chunks_per_rank) return false;
    int const stage = shape_.stage_of(rank, action.chunk);
    bool const towards_next = action.kind == action_kind::send_activation || action.kind == action_kind::recv_gradient;
    bool const towards_previous =
        action.kind == action_kind::recv_activation || action.kind == action_kind::send_gradient;
    if (towards_next) return !shape_.is_last(stage) && action.peer == shape_.rank_of(stage + 1);
    if (towards_previous) return !shape_.is_first(stage) && action.peer == shape_.rank_of(stage - 1);
    return computes(action.kind);
  }

  constexpr schedule_rule execute(int rank, int step, pipeline_action const& action) {
    int const stage = shape_.stage_of(rank, action.chunk);
    auto& state = progress(stage, action.microbatch);
    switch (action.kind) {
      case action_kind::forward:
        if (state.forward_done) return schedule_rule::done_twice;
        if (!shape_.is_first(stage) && !state.input_received) return schedule_rule::forward_before_input;
        state.forward_done = true;
        return schedule_rule::none;
      case action_kind::backward:
      case action_kind::backward_input:
        if (state.input_gradient_done || state.weight_done) return schedule_rule::done_twice;
        if (!state.forward_done) return schedule_rule::backward_before_forward;
        if (!shape_.is_last(stage) && !state.gradient_received) return schedule_rule::backward_before_gradient;
        state.input_gradient_done = true;
        state.weight_done = action.kind == action_kind::backward;
        return schedule_rule::none;
      case action_kind::backward_weight:
        if (state.weight_done) return schedule_rule::done_twice;
        if (!state.input_gradient_done) return schedule_rule::weight_before_input_gradient;
        state.weight_done = true;
        return schedule_rule::none;
      case action_kind::send_activation:
      case action_kind::send_gradient: {
        bool const computed = carries_gradient(action.kind) ? state.input_gradient_done : state.forward_done;
        if (!computed) return schedule_rule::send_before_compute;
        channel(rank, action.peer, action.kind).messages.push_back({action, rank, step});
        return schedule_rule::none;
      }
      case action_kind::recv_activation:
        return receive(rank, action, stage - 1, state.input_received);
      case action_kind::recv_gradient:
        return receive(rank, action, stage + 1, state.gradient_received);
    }
    return schedule_rule::malformed_action;
  }

  // Takes the channel's next message, which must come from `sender_stage` for this microbatch.
  constexpr schedule_rule receive(int rank, pipeline_action const& action, int sender_stage, bool& received) {
    auto& from_peer = channel(action.peer, rank, action.kind);
    auto const& message = from_peer.messages[from_peer.next];
    if (message.send.microbatch != action.microbatch ||
        shape_.stage_of(message.sender, message.send.chunk) != sender_stage) {
      arrived_ = message.send;
      return schedule_rule::receive_out_of_order;
    }
    ++from_peer.next;
    if (received) return schedule_rule::done_twice;
    received = true;
    return schedule_rule::none;
  }

  constexpr bool message_waiting(int rank, pipeline_action const& action) {
    auto const& from_peer = channel(action.peer, rank, action.kind);
    return from_peer.next < from_peer.messages.size();
  }

  constexpr schedule_check first_never_computed() const {
    for (int rank = 0; rank < shape_.stages; ++rank)
      for (int chunk = 0; chunk < shape_.chunks_per_rank; ++chunk)
        for (int microbatch = 0; microbatch < shape_.microbatches; ++microbatch) {
          auto const& state = progress_[index(shape_.stage_of(rank, chunk), microbatch)];
          if (!state.forward_done)
            return {schedule_rule::never_computed, rank, length(rank), pipeline_action::forward(microbatch, chunk), {}};
          if (!state.input_gradient_done)
            return {
                schedule_rule::never_computed, rank, length(rank), pipeline_action::backward(microbatch, chunk), {}};
          if (!state.weight_done)
            return {schedule_rule::never_computed,
                    rank,
                    length(rank),
                    pipeline_action::backward_weight(microbatch, chunk),
                    {}};
        }
    return {};
  }

  constexpr schedule_check first_never_received() const {
    for (auto const& each : channels_)
      if (each.next < each.messages.size()) {
        auto const& message = each.messages[each.next];
        return {schedule_rule::message_never_received, message.sender, message.step, message.send, {}};
      }
    return {};
  }

  constexpr int length(int rank) const { return static_cast<int>(table_[rank].size()); }
  constexpr std::size_t index(int stage, int microbatch) const {
    return static_cast<std::size_t>(stage * shape_.microbatches + microbatch);
  }
  constexpr stage_progress& progress(int stage, int microbatch) { return progress_[index(stage, microbatch)]; }
  constexpr pipeline_channel& channel(int from, int to, action_kind kind) {
    int const gradient = carries_gradient(kind) ? 1 : 0;
    return channels_[static_cast<std::size_t>((from * shape_.stages + to) * 2 + gradient)];
  }
  constexpr pipeline_channel const& channel(int from, int to, action_kind kind) const {
    int const gradient = carries_gradient(kind) ? 1 : 0;
    return channels_[static_cast<std::size_t>((from * shape_.stages + to) * 2 + gradient)];
  }

  std::vector<pipeline_actions> const& table_;
  pipeline_shape shape_;
  int bound_;
  long events_ = 0;  // actions done and sends released: the rounds go on while it grows
  std::vector<int> next_step_;
  std::vector<char> waiting_in_send_;  // not vector<bool>: clang cannot evaluate libstdc++'s in a constant expression
  std::vector<stage_progress> progress_;
  std::vector<pipeline_channel> channels_;
  pipeline_action arrived_{};
};

}  // namespace detail

/// Checks an action table (element r: rank r's actions) of a pipeline of `shape`, with at most
/// `in_flight_per_peer` unreceived messages from one rank to another before a send waits (unbounded_in_flight:
/// never): see schedule_rule for what it rejects. Returns the first problem the simulation meets, or ok().
constexpr schedule_check simulate_table(std::vector<pipeline_actions> const& table, pipeline_shape shape,
                                        int in_flight_per_peer = unbounded_in_flight) {
  if (shape.stages < 1 || shape.chunks_per_rank < 1 || shape.microbatches < 1)
    return {schedule_rule::counts_not_supported, -1, -1, {}, {}};
  if (table.size() != static_cast<std::size_t>(shape.stages))  // a rank without a list cannot take part
    return {schedule_rule::malformed_action, static_cast<int>(table.size()), -1, {}, {}};
  return detail::schedule_simulator(table, shape, in_flight_per_peer).run();
}

/// Checks `schedule` with these counts: whether it supports them, then its action table (simulate_table).
template <pipeline_schedule S>
constexpr schedule_check simulate_schedule(S const& schedule, int stages, int microbatches) {
  if (stages < 1 || microbatches < 1 || !schedule.supports(stages, microbatches))
    return {schedule_rule::counts_not_supported, -1, -1, {}, {}};
  return simulate_table(action_table(schedule, stages, microbatches), shape_of<S>(stages, microbatches),
                        in_flight_per_peer<S>());
}

}  // namespace shardwise
