// Pipeline schedules as types and the check of their action tables (pipeline/schedule.hpp): the built-in
// schedules pass at compile time and at run time; broken tables are reported with the rule, rank and step.
// Every expected order below is written out by hand from the published definitions, not computed by the code.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <shardwise/pipeline/schedule.hpp>
#include <shardwise/pipeline/stages.hpp>
#include <shardwise/pipeline/timeline.hpp>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace sw = shardwise;
using sw::action_kind;
using sw::schedule_rule;
using A = sw::pipeline_action;

template <>
struct doctest::StringMaker<sw::pipeline_action> {
  static doctest::String convert(sw::pipeline_action const& action) { return sw::detail::describe(action).c_str(); }
};

#include "compile_fail/pipeline_schedule_bounded_deadlock.cpp"  // ForwardsFirstSplitBackward, as it compiles

namespace {

// "F0 F1 B0 ..." (with ".c" for the chunk when `chunks` > 1): a rank's compute order, the sends and receives left out;
// B is a whole backward or its input-gradient half, W the weight-gradient half.
std::string compute_order(sw::pipeline_actions const& actions, bool chunks = false) {
  std::string order;
  for (auto const& action : actions) {
    if (!sw::computes(action.kind)) continue;
    if (!order.empty()) order += ' ';
    order += action.kind == action_kind::forward ? 'F' : action.kind == action_kind::backward_weight ? 'W' : 'B';
    order += std::to_string(action.microbatch);
    if (chunks) order += "." + std::to_string(action.chunk);
  }
  return order;
}

// The built-in schedules pass at compile time for stages 1, 2, 4 and microbatches 1..8 (Interleaved1F1B: the
// multiples of the stages; it refuses the others, see below).
template <class Schedule, int Stages, int... Microbatches>
constexpr bool all_pass(std::integer_sequence<int, Microbatches...>) {
  auto const passes = [](int microbatches) {
    auto const check = sw::simulate_schedule(Schedule{}, Stages, microbatches);
    return check.ok() ||
           (!Schedule::supports(Stages, microbatches) && check.rule == schedule_rule::counts_not_supported);
  };
  return (passes(Microbatches + 1) && ...);
}
using one_to_eight = std::make_integer_sequence<int, 8>;
static_assert(all_pass<sw::GPipe, 1>(one_to_eight{}) && all_pass<sw::GPipe, 2>(one_to_eight{}) &&
              all_pass<sw::GPipe, 4>(one_to_eight{}));
static_assert(all_pass<sw::OneFOneB, 1>(one_to_eight{}) && all_pass<sw::OneFOneB, 2>(one_to_eight{}) &&
              all_pass<sw::OneFOneB, 4>(one_to_eight{}));
static_assert(all_pass<sw::ZeroBubbleH1, 1>(one_to_eight{}) && all_pass<sw::ZeroBubbleH1, 2>(one_to_eight{}) &&
              all_pass<sw::ZeroBubbleH1, 4>(one_to_eight{}));
static_assert(all_pass<sw::Interleaved1F1B<2>, 1>(one_to_eight{}) &&
              all_pass<sw::Interleaved1F1B<2>, 2>(one_to_eight{}) &&
              all_pass<sw::Interleaved1F1B<2>, 4>(one_to_eight{}));

// checked_schedule itself (its static_asserts) accepts them, fewer microbatches than stages included.
static_assert(sw::checked_schedule<sw::GPipe, 4, 1>::result.ok());
static_assert(sw::checked_schedule<sw::GPipe, 4, 3>::result.ok());
static_assert(sw::checked_schedule<sw::OneFOneB, 4, 1>::result.ok());
static_assert(sw::checked_schedule<sw::OneFOneB, 4, 3>::result.ok());
static_assert(sw::checked_schedule<sw::OneFOneB, 4, 8>::result.ok());
static_assert(sw::checked_schedule<sw::Interleaved1F1B<2>, 4, 8>::result.ok());
static_assert(all_pass<sw::DualPipeV, 1>(one_to_eight{}) && all_pass<sw::DualPipeV, 2>(one_to_eight{}) &&
              all_pass<sw::DualPipeV, 4>(one_to_eight{}));  // fewer than 2 p microbatches: refused by name
static_assert(sw::checked_schedule<sw::DualPipeV, 4, 8>::result.ok());
static_assert(sw::checked_schedule<sw::bounded<sw::DualPipeV, 2>, 4, 8>::result.ok());  // two messages a link
static_assert(sw::checked_schedule<sw::Interleaved1F1B<3>, 2, 6>::result.ok());
static_assert(sw::checked_schedule<sw::OneFOneB, 4, 8>::shape.stages == 4 &&
              sw::checked_schedule<sw::Interleaved1F1B<2>, 4, 8>::shape.chunks_per_rank == 2);

// Interleaved 1F1B runs its microbatches in whole groups of `stages`: other counts are refused, not hung.
static_assert(!sw::Interleaved1F1B<2>::supports(4, 2) && !sw::Interleaved1F1B<2>::supports(4, 6));
static_assert(sw::simulate_schedule(sw::Interleaved1F1B<2>{}, 4, 6).rule == schedule_rule::counts_not_supported);
static_assert(sw::OneFOneB::supports(4, 1) && sw::GPipe::supports(8, 1));  // fewer microbatches than stages

// A schedule of one's own: the concept names what it must provide.
struct NotASchedule {};
struct WithoutSupports {
  static constexpr int chunks_per_rank = 1;
  static constexpr sw::pipeline_actions actions(int, int, int) { return {}; }
};
static_assert(sw::pipeline_schedule<sw::GPipe> && sw::pipeline_schedule<sw::OneFOneB> &&
              sw::pipeline_schedule<sw::ZeroBubbleH1> && sw::pipeline_schedule<sw::Interleaved1F1B<2>>);
static_assert(!sw::pipeline_schedule<NotASchedule> && !sw::schedule_chunks<NotASchedule>);
static_assert(!sw::pipeline_schedule<WithoutSupports> && !sw::schedule_counts<WithoutSupports> &&
              sw::schedule_chunks<WithoutSupports> && sw::schedule_actions<WithoutSupports>);

// Two stages, one microbatch, and a sound order written by hand: it plugs in and passes.
struct HandWritten {
  static constexpr int chunks_per_rank = 1;
  static constexpr bool supports(int stages, int microbatches) { return stages == 2 && microbatches == 1; }
  static constexpr sw::pipeline_actions actions(int rank, int, int) {
    if (rank == 0) return {A::forward(0), A::send_activation(1, 0), A::recv_gradient(1, 0), A::backward(0)};
    return {A::recv_activation(0, 0), A::forward(0), A::backward(0), A::send_gradient(0, 0)};
  }
};
static_assert(sw::checked_schedule<HandWritten, 2, 1>::result.ok());

// docs/guide.md's own schedule, written with action_writer: GPipe with the backwards from the last microbatch.
struct ForwardsThenBackwardsReversed {
  static constexpr int chunks_per_rank = 1;
  static constexpr bool supports(int stages, int microbatches) { return stages >= 1 && microbatches >= 1; }
  static constexpr sw::pipeline_actions actions(int rank, int stages, int microbatches) {
    sw::action_writer writer({stages, chunks_per_rank, microbatches}, rank);
    for (int m = 0; m < microbatches; ++m) writer.forward(m);
    for (int m = microbatches - 1; m >= 0; --m) writer.backward(m);
    return std::move(writer).take();
  }
};
static_assert(sw::checked_schedule<ForwardsThenBackwardsReversed, 4, 8>::result.ok());

// Rank 0 waits for the gradient before it has sent the activation that the gradient needs: a deadlock.
struct GradientBeforeActivation {
  static constexpr int chunks_per_rank = 1;
  static constexpr bool supports(int stages, int microbatches) { return stages == 2 && microbatches == 1; }
  static constexpr sw::pipeline_actions actions(int rank, int, int) {
    if (rank == 0) return {A::forward(0), A::recv_gradient(1, 0), A::send_activation(1, 0), A::backward(0)};
    return {A::recv_activation(0, 0), A::forward(0), A::backward(0), A::send_gradient(0, 0)};
  }
};
constexpr auto deadlock = sw::simulate_schedule(GradientBeforeActivation{}, 2, 1);
static_assert(deadlock.rule == schedule_rule::deadlock && deadlock.rank == 0 && deadlock.step == 1 &&
              deadlock.action == A::recv_gradient(1, 0));

// Rank 1 receives microbatch 1 first, while rank 0 sends microbatch 0 first (GPipe otherwise).
struct SwappedReceives {
  static constexpr int chunks_per_rank = 1;
  static constexpr bool supports(int stages, int microbatches) { return stages == 2 && microbatches == 2; }
  static constexpr sw::pipeline_actions actions(int rank, int stages, int microbatches) {
    if (rank == 0) return sw::GPipe::actions(rank, stages, microbatches);
    return {A::recv_activation(0, 1), A::forward(1),          A::recv_activation(0, 0), A::forward(0),
            A::backward(0),           A::send_gradient(0, 0), A::backward(1),           A::send_gradient(0, 1)};
  }
};
constexpr auto swapped = sw::simulate_schedule(SwappedReceives{}, 2, 2);
static_assert(swapped.rule == schedule_rule::receive_out_of_order && swapped.rank == 1 && swapped.step == 0 &&
              swapped.action == A::recv_activation(0, 1) && swapped.arrived == A::send_activation(1, 0));

// Checks a hand-written two-stage table, one microbatch (or two).
sw::schedule_check check_two_stages(sw::pipeline_actions rank0, sw::pipeline_actions rank1, int microbatches = 1) {
  return sw::simulate_table({std::move(rank0), std::move(rank1)}, {2, 1, microbatches});
}

}  // namespace

TEST_CASE("GPipe, 2 stages, 2 microbatches: every action, as the published definition orders them") {
  CHECK(sw::GPipe::actions(0, 2, 2) == sw::pipeline_actions{A::forward(0), A::send_activation(1, 0), A::forward(1),
                                                            A::send_activation(1, 1), A::recv_gradient(1, 0),
                                                            A::backward(0), A::recv_gradient(1, 1), A::backward(1)});
  CHECK(sw::GPipe::actions(1, 2, 2) ==
        sw::pipeline_actions{A::recv_activation(0, 0), A::forward(0), A::recv_activation(0, 1), A::forward(1),
                             A::backward(0), A::send_gradient(0, 0), A::backward(1), A::send_gradient(0, 1)});
}

TEST_CASE("1F1B: warm-up of stages - 1 - rank forwards, one forward one backward, cool-down") {
  // 4 stages, 8 microbatches.
  CHECK(compute_order(sw::OneFOneB::actions(0, 4, 8)) == "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7");
  CHECK(compute_order(sw::OneFOneB::actions(1, 4, 8)) == "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7");
  CHECK(compute_order(sw::OneFOneB::actions(3, 4, 8)) == "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7");
  // Fewer microbatches (2) than stages (4): the warm-up is cut to the microbatches there are.
  CHECK(compute_order(sw::OneFOneB::actions(0, 4, 2)) == "F0 F1 B0 B1");
  CHECK(compute_order(sw::OneFOneB::actions(2, 4, 2)) == "F0 F1 B0 B1");
  CHECK(compute_order(sw::OneFOneB::actions(3, 4, 2)) == "F0 B0 F1 B1");
  // Each forward receives from the rank before and sends to the rank after.
  CHECK(sw::OneFOneB::actions(1, 4, 1) == sw::pipeline_actions{A::recv_activation(0, 0), A::forward(0),
                                                               A::send_activation(2, 0), A::recv_gradient(2, 0),
                                                               A::backward(0), A::send_gradient(0, 0)});
}

TEST_CASE("interleaved 1F1B, 2 stages, 2 chunks, 4 microbatches: Megatron's order (microbatch.chunk)") {
  // Rank 0 warms up with 2 * (2 - 1 - 0) + (2 - 1) * 2 = 4 chunk-forwards; rank 1 with 2.
  CHECK(compute_order(sw::Interleaved1F1B<2>::actions(0, 2, 4), true) ==
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0");
  CHECK(compute_order(sw::Interleaved1F1B<2>::actions(1, 2, 4), true) ==
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0");
  // Chunk c of rank r is stage c * 2 + r: rank 0's chunk 1 (stage 2) takes its input from rank 1's chunk 0
  // (stage 1), and rank 1's chunk 1 is the last stage (no gradient to receive, none to send further).
  auto const rank1 = sw::Interleaved1F1B<2>::actions(1, 2, 4);
  CHECK(rank1[0] == A::recv_activation(0, 0, 0));
  CHECK(rank1[2] == A::send_activation(0, 0, 0));
  CHECK(std::count(rank1.begin(), rank1.end(), A::send_activation(0, 0, 1)) == 0);
  CHECK(std::count(rank1.begin(), rank1.end(), A::recv_gradient(0, 0, 1)) == 0);
  CHECK(sw::Interleaved1F1B<2>::actions(0, 2, 4)[4] == A::recv_activation(1, 0, 1));  // after F0.0, send, F1.0, send
}

// The messages of a rank's table in order, the compute steps left out.
sw::pipeline_actions messages_of(sw::pipeline_actions const& actions) {
  sw::pipeline_actions messages;
  for (auto const& action : actions)
    if (!sw::computes(action.kind)) messages.push_back(action);
  return messages;
}

TEST_CASE("ZB-H1: 1F1B's forwards and Bs, each W after its B, held back by the rank (written by hand)") {
  CHECK(compute_order(sw::ZeroBubbleH1::actions(0, 2, 4)) == "F0 F1 B0 W0 F2 B1 W1 F3 B2 W2 B3 W3");
  CHECK(compute_order(sw::ZeroBubbleH1::actions(1, 2, 4)) == "F0 B0 F1 B1 W0 F2 B2 W1 F3 B3 W2 W3");
  CHECK(compute_order(sw::ZeroBubbleH1::actions(3, 4, 2)) == "F0 B0 F1 B1 W0 W1");  // fewer microbatches than r
  CHECK(compute_order(sw::ZeroBubbleH1::actions(2, 4, 6)) == "F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 B5 W3 W4 W5");
  CHECK(sw::ZeroBubbleH1::actions(1, 2, 1) == sw::pipeline_actions{A::recv_activation(0, 0), A::forward(0),
                                                                   A::backward_input(0), A::send_gradient(0, 0),
                                                                   A::backward_weight(0)});
  for (int stages = 1; stages <= 8; ++stages)
    for (int microbatches = 1; microbatches <= 16; ++microbatches)
      for (int rank = 0; rank < stages; ++rank) {
        CAPTURE(stages);
        CAPTURE(microbatches);
        CAPTURE(rank);
        // W sends nothing: the messages are 1F1B's, in 1F1B's order, so it runs wherever 1F1B runs.
        CHECK(messages_of(sw::ZeroBubbleH1::actions(rank, stages, microbatches)) ==
              messages_of(sw::OneFOneB::actions(rank, stages, microbatches)));
        // Every rank holds min(stages, microbatches) between forward and W (1F1B's rank 0), and rank + 1 Bs waiting
        // for their W.
        CHECK(sw::peak_in_flight(sw::ZeroBubbleH1::actions(rank, stages, microbatches)) ==
              std::min(stages, microbatches));
        CHECK(sw::peak_weight_pending(sw::ZeroBubbleH1::actions(rank, stages, microbatches)) ==
              std::min(rank + 1, microbatches));
      }
}

TEST_CASE("ZBV: the V placement, and PyTorch's order transcribed (microbatch.chunk)") {
  constexpr auto shape = sw::shape_of<sw::ZeroBubbleV>(4, 8);
  static_assert(shape.placement == sw::stage_placement::v && shape.model_stages() == 8);
  static_assert(shape.stage_of(0, 0) == 0 && shape.stage_of(0, 1) == 7 && shape.stage_of(3, 1) == 4);
  static_assert(shape.rank_of(4) == 3 && shape.rank_of(7) == 0 && shape.chunk_of(4) == 1 && shape.chunk_of(3) == 0);
  static_assert(sw::checked_schedule<sw::ZeroBubbleV, 4, 8>::shape.placement == sw::stage_placement::v);
  // PyTorch's _calculate_single_rank_operations for ScheduleZBVZeroBubble, p = 2, m = 4, rank 0, written out by hand.
  CHECK(compute_order(sw::ZeroBubbleV::actions(0, 2, 4), true) ==
        "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 B1.1 W1.1 F3.0 B0.0 W0.0 F2.1 B2.1 W2.1 B1.0 W1.0 F3.1 B3.1 W3.1 B2.0 "
        "W2.0 B3.0 W3.0");
  // The turn of the V is on the last rank, from its chunk 0 (stage 1) to its chunk 1 (stage 2): to itself.
  auto const last = sw::ZeroBubbleV::actions(1, 2, 1);
  CHECK(std::find(last.begin(), last.end(), A::send_activation(1, 0, 0)) != last.end());
  CHECK(std::find(last.begin(), last.end(), A::recv_activation(1, 0, 1)) != last.end());
  for (int stages = 1; stages <= 8; ++stages)
    for (int microbatches = 1; microbatches <= 16; ++microbatches) {
      CAPTURE(stages);
      CAPTURE(microbatches);
      CHECK(sw::simulate_schedule(sw::ZeroBubbleV{}, stages, microbatches).ok());
      CHECK(sw::simulate_schedule(sw::bounded<sw::ZeroBubbleV, 2>{}, stages, microbatches).ok());
      if (microbatches < 2 * stages - 1) continue;
      for (int rank = 0; rank < stages; ++rank)  // 2 stages' worth of half-size chunks on every rank
        CHECK(sw::peak_in_flight(sw::ZeroBubbleV::actions(rank, stages, microbatches)) == 2 * stages);
    }
  CHECK(sw::simulate_schedule(sw::bounded<sw::ZeroBubbleV, 1>{}, 2, 4).rule == schedule_rule::deadlock_at_bound);
}

namespace {
/// F, B (input gradient), W and BW (a whole backward) with microbatch.chunk, as PyTorch's action names go.
std::string dual_order(sw::pipeline_actions const& actions) {
  std::string order;
  for (auto const& action : actions) {
    if (!sw::computes(action.kind)) continue;
    if (!order.empty()) order += ' ';
    order += action.kind == action_kind::forward           ? "F"
             : action.kind == action_kind::backward_input  ? "B"
             : action.kind == action_kind::backward_weight ? "W"
                                                           : "BW";
    order += std::to_string(action.microbatch) + "." + std::to_string(action.chunk);
  }
  return order;
}
}  // namespace

TEST_CASE("DualPipeV: PyTorch's order transcribed, deadlock-free with two messages a link, 2 p + 1 in flight") {
  // PyTorch 2.15's ScheduleDualPipeV._calculate_single_rank_operations, p = 2, each overlapped F and BW pair written
  // as its two actions, written out by hand.
  CHECK(dual_order(sw::DualPipeV::actions(0, 2, 4)) ==
        "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 BW1.1 F2.1 BW0.0 BW2.1 F3.1 BW1.0 BW3.1 B2.0 W2.0 B3.0 W3.0");
  CHECK(dual_order(sw::DualPipeV::actions(1, 2, 4)) ==
        "F0.0 F0.1 F1.0 F1.1 F2.0 BW0.1 F2.1 BW0.0 F3.0 BW1.1 F3.1 BW1.0 BW2.1 BW2.0 B3.1 B3.0 W3.1 W3.0");
  CHECK(dual_order(sw::DualPipeV::actions(0, 2, 5)) ==
        "F0.0 F1.0 F2.0 F0.1 B0.1 W0.1 F1.1 F3.0 BW1.1 F2.1 BW0.0 F4.0 BW2.1 F3.1 BW1.0 BW3.1 F4.1 BW2.0 BW4.1 B3.0 "
        "W3.0 B4.0 W4.0");
  CHECK_FALSE(sw::DualPipeV::supports(4, 7));
  CHECK(sw::simulate_schedule(sw::DualPipeV{}, 4, 7).rule == schedule_rule::counts_not_supported);
  for (int stages = 1; stages <= 8; ++stages)
    for (int microbatches = 2 * stages; microbatches <= 20; ++microbatches) {
      CAPTURE(stages);
      CAPTURE(microbatches);
      CHECK(sw::simulate_schedule(sw::DualPipeV{}, stages, microbatches).ok());
      CHECK(sw::simulate_schedule(sw::bounded<sw::DualPipeV, 2>{}, stages, microbatches).ok());
      for (int rank = 0; rank < stages; ++rank)  // DeepSeek's table: PP + 1 half-size chunks' activations
        CHECK(sw::peak_in_flight(sw::DualPipeV::actions(rank, stages, microbatches)) <= 2 * stages + 1);
    }
}

TEST_CASE("the timeline of a table: 1F1B's (p-1)/(m+p-1), and ZB-H1 and ZBV at their lower bounds") {
  for (int p : {1, 2, 3, 4, 8})
    for (int m = 1; m <= 16; ++m) {
      CAPTURE(p);
      CAPTURE(m);
      sw::pipeline_times const unit{1, 1, 1, 0};  // F = B = W: a whole backward is twice a forward
      auto const one = sw::schedule_timeline(sw::OneFOneB{}, p, m, unit);
      CHECK(one.makespan == 3.0 * (m + p - 1));  // the textbook 1F1B and GPipe step
      CHECK(sw::schedule_timeline(sw::GPipe{}, p, m, unit).makespan == 3.0 * (m + p - 1));
      CHECK(std::abs(one.bubble() - double(p - 1) / double(m + p - 1)) < 1e-12);
      // ZB-H1: the last rank can start after p - 1 forwards and has 3m of work: 3m + p - 1 is the least possible,
      // and the paper's (p-1)/(3m+p-1) bubble, once there are as many microbatches as stages.
      auto const h1 = sw::schedule_timeline(sw::ZeroBubbleH1{}, p, m, unit);
      CHECK(h1.complete);
      if (m >= p) CHECK(h1.makespan == 3.0 * m + p - 1);
      CHECK(h1.makespan <= one.makespan);
      // ZBV: half-size chunks, each rank 2m chunk-microbatches of 1.5; the last rank starts after p - 1 half
      // forwards: 3m + (p - 1) / 2 at least, reached once there are 2p microbatches.
      auto const v = sw::schedule_timeline(sw::ZeroBubbleV{}, p, m, {0.5, 0.5, 0.5, 0});
      if (m >= 2 * p) CHECK(v.makespan == 3.0 * m + 0.5 * (p - 1));
      CHECK(v.makespan <= h1.makespan);
      // DualPipeV, its pairs run one after the other: a bubble of (p - 1)(F + B - W) in chunk times, ZBV's, which is
      // DeepSeek's (p - 1)(F&B + B - 3W) with F&B = F + B + W when B = W; and with B and W apart.
      if (m >= 2 * p) {
        CHECK(sw::schedule_timeline(sw::DualPipeV{}, p, m, {0.5, 0.5, 0.5, 0}).makespan == 3.0 * m + 0.5 * (p - 1));
        double const apart = sw::schedule_timeline(sw::DualPipeV{}, p, m, {0.5, 0.6, 0.3, 0}).makespan;
        CHECK(std::abs(apart - (2.8 * m + 0.8 * (p - 1))) < (p < 8 ? 1e-9 : 0.21));  // p 8, m 16: 0.2 more
      }
    }
  // A message's time on the link delays every receive on another rank: 1F1B at p = 2, m = 1 waits for it twice.
  CHECK(sw::schedule_timeline(sw::OneFOneB{}, 2, 1, {1, 1, 1, 0.25}).makespan == 6.5);
  // A table the check refuses stops: not complete.
  CHECK_FALSE(sw::simulate_timeline({{A::recv_gradient(1, 0)}, {}}, {2, 1, 1}, {}).complete);
}

TEST_CASE("a split backward: W after its B, each once, and a missing W named") {
  SUBCASE("W before its B") {
    auto const check = sw::simulate_table({{A::forward(0), A::backward_weight(0), A::backward_input(0)}}, {1, 1, 1});
    CHECK(check.rule == schedule_rule::weight_before_input_gradient);
    CHECK(check.step == 1);
    CHECK(check.action == A::backward_weight(0));
    CHECK(sw::detail::describe(check, 1, 1) ==
          "rank 0, step 1, backward_weight(microbatch 0, chunk 0): a backward_weight (W) runs before the "
          "backward_input (B) of its microbatch and chunk; W uses what B keeps: put it after that B");
  }
  SUBCASE("W twice, and W after a whole backward") {
    auto const twice = sw::simulate_table(
        {{A::forward(0), A::backward_input(0), A::backward_weight(0), A::backward_weight(0)}}, {1, 1, 1});
    CHECK(twice.rule == schedule_rule::done_twice);
    CHECK(twice.step == 3);
    auto const after_whole = sw::simulate_table({{A::forward(0), A::backward(0), A::backward_weight(0)}}, {1, 1, 1});
    CHECK(after_whole.rule == schedule_rule::done_twice);
    CHECK(after_whole.step == 2);
  }
  SUBCASE("a W never run, and a gradient sent after B (not W)") {
    auto const missing = sw::simulate_table({{A::forward(0), A::backward_input(0)}}, {1, 1, 1});
    CHECK(missing.rule == schedule_rule::never_computed);
    CHECK(missing.action == A::backward_weight(0));
    auto const sent_after_b = check_two_stages(
        {A::forward(0), A::send_activation(1, 0), A::recv_gradient(1, 0), A::backward_input(0), A::backward_weight(0)},
        {A::recv_activation(0, 0), A::forward(0), A::backward_input(0), A::send_gradient(0, 0), A::backward_weight(0)});
    CHECK(sent_after_b.ok());
  }
}

TEST_CASE("finite buffers: a table that runs unbounded and at 2 messages in flight per peer deadlocks at 1") {
  // The compile-fail test's table (declaring 2 here), traced by hand in docs/design-zero-bubble.md: at 1, rank 0
  // waits in its send of activation 3 while rank 1 waits in its send of gradient 1, neither receiving.
  auto const table = sw::action_table(ForwardsFirstSplitBackward{}, 2, 4);
  CHECK(sw::simulate_table(table, {2, 1, 4}).ok());
  CHECK(sw::simulate_table(table, {2, 1, 4}, 2).ok());
  auto const at_one = sw::simulate_table(table, {2, 1, 4}, 1);
  CHECK(at_one.rule == schedule_rule::deadlock_at_bound);
  CHECK(at_one.rank == 0);
  CHECK(at_one.step == 7);
  CHECK(at_one.action == A::send_activation(1, 3));
  CHECK_THROWS_WITH_AS(sw::check_schedule(sw::bounded<ForwardsFirstSplitBackward, 1>{}, 2, 4),
                       "shardwise::check_schedule: rank 0, step 7, send_activation(microbatch 3, chunk 0) to rank 1: "
                       "the schedule deadlocks once a peer may hold only in_flight_per_peer unreceived messages: this "
                       "send waits for its peer to receive, while the peer waits on this rank; receive earlier on "
                       "the peer, send later, or raise in_flight_per_peer (sw::bounded<Schedule, K>)",
                       sw::error);
  static_assert(sw::checked_schedule<sw::bounded<ForwardsFirstSplitBackward, 2>, 2, 4>::result.ok());
  static_assert(sw::in_flight_per_peer<sw::bounded<sw::OneFOneB, 3>>() == 3 &&
                sw::in_flight_per_peer<sw::OneFOneB>() == sw::unbounded_in_flight);
}

TEST_CASE("finite buffers: the slots per peer each built-in schedule needs (docs/pipeline.md)") {
  // 1F1B at 2 stages with a rendezvous send (0 slots), by hand: rank 0 sends activation 0 and waits until rank 1
  // takes it; rank 1 computes and sends gradient 0, waiting for rank 0 to take it; rank 0 goes on to send
  // activation 1 and waits there before it would receive that gradient.
  auto const rendezvous = sw::simulate_schedule(sw::bounded<sw::OneFOneB, 0>{}, 2, 2);
  CHECK(rendezvous.rule == schedule_rule::deadlock_at_bound);
  CHECK(rendezvous.rank == 0);
  CHECK(rendezvous.step == 3);
  CHECK(rendezvous.action == A::send_activation(1, 1));
  CHECK(sw::simulate_schedule(sw::bounded<sw::ZeroBubbleH1, 0>{}, 2, 2).rule == schedule_rule::deadlock_at_bound);
  CHECK(sw::simulate_schedule(sw::bounded<sw::Interleaved1F1B<2>, 1>{}, 2, 4).rule == schedule_rule::deadlock_at_bound);
  for (int stages = 1; stages <= 8; ++stages)
    for (int microbatches = 1; microbatches <= 16; ++microbatches) {
      CAPTURE(stages);
      CAPTURE(microbatches);
      // GPipe's messages flow one way at a time: a send waits only for a rank that is about to receive it.
      CHECK(sw::simulate_schedule(sw::bounded<sw::GPipe, 0>{}, stages, microbatches).ok());
      CHECK(sw::simulate_schedule(sw::bounded<sw::OneFOneB, 1>{}, stages, microbatches).ok());
      CHECK(sw::simulate_schedule(sw::bounded<sw::ZeroBubbleH1, 1>{}, stages, microbatches).ok());
      bool const whole_groups = microbatches % stages == 0;
      CHECK(sw::simulate_schedule(sw::bounded<sw::Interleaved1F1B<2>, 2>{}, stages, microbatches).ok() == whole_groups);
      CHECK(sw::simulate_schedule(sw::bounded<sw::Interleaved1F1B<3>, 2>{}, stages, microbatches).ok() == whole_groups);
    }
}

TEST_CASE("every schedule passes at run time: stages <= 8, chunks <= 3, microbatches <= 16") {
  for (int stages = 1; stages <= 8; ++stages)
    for (int microbatches = 1; microbatches <= 16; ++microbatches) {
      CAPTURE(stages);
      CAPTURE(microbatches);
      CHECK(sw::simulate_schedule(sw::GPipe{}, stages, microbatches).ok());
      CHECK(sw::simulate_schedule(sw::OneFOneB{}, stages, microbatches).ok());
      CHECK(sw::simulate_schedule(sw::ZeroBubbleH1{}, stages, microbatches).ok());
      bool const whole_groups = microbatches % stages == 0;
      CHECK(sw::simulate_schedule(sw::Interleaved1F1B<1>{}, stages, microbatches).ok() == whole_groups);
      CHECK(sw::simulate_schedule(sw::Interleaved1F1B<2>{}, stages, microbatches).ok() == whole_groups);
      CHECK(sw::simulate_schedule(sw::Interleaved1F1B<3>{}, stages, microbatches).ok() == whole_groups);
      CHECK_NOTHROW(sw::check_schedule(sw::OneFOneB{}, stages, microbatches));
    }
}

TEST_CASE("activations in flight: 1F1B rank r holds min(stages - r, microbatches), GPipe all of them") {
  for (int stages : {1, 2, 4})
    for (int microbatches = 1; microbatches <= 8; ++microbatches)
      for (int rank = 0; rank < stages; ++rank) {
        CAPTURE(stages);
        CAPTURE(microbatches);
        CAPTURE(rank);
        CHECK(sw::peak_in_flight(sw::OneFOneB::actions(rank, stages, microbatches)) ==
              std::min(stages - rank, microbatches));
        CHECK(sw::peak_in_flight(sw::GPipe::actions(rank, stages, microbatches)) == microbatches);
      }
}

TEST_CASE("interleaved 1F1B refuses microbatches that are not a multiple of the stages, with the reason") {
  CHECK_THROWS_WITH_AS(sw::check_schedule(sw::Interleaved1F1B<2>{}, 4, 6),
                       "shardwise::check_schedule: 6 microbatches on 4 stages: the schedule cannot run this many "
                       "microbatches on this many stages (Interleaved1F1B needs a multiple of the stages); give "
                       "counts its supports(stages, microbatches) accepts, or use OneFOneB, which runs any",
                       sw::error);
  CHECK(sw::Interleaved1F1B<2>::actions(0, 4, 6).empty());
  CHECK_NOTHROW(sw::check_schedule(sw::Interleaved1F1B<2>{}, 4, 8));
}

TEST_CASE("a deadlock names the rank, the step and the receive it waits in, at run time too") {
  CHECK_THROWS_WITH_AS(sw::check_schedule(GradientBeforeActivation{}, 2, 1),
                       "shardwise::check_schedule: rank 0, step 1, recv_gradient(microbatch 0, chunk 0) from rank 1: "
                       "the schedule deadlocks: every unfinished rank waits in a receive whose message is sent only "
                       "after a wait of its own, or never; move the peer's send before the receive it feeds",
                       sw::error);
  // Rank 1 waits for an activation rank 0 never sends.
  auto const never_sent =
      check_two_stages({A::forward(0), A::recv_gradient(1, 0), A::backward(0)},
                       {A::recv_activation(0, 0), A::forward(0), A::backward(0), A::send_gradient(0, 0)});
  CHECK(never_sent.rule == schedule_rule::deadlock);
  CHECK(never_sent.rank == 0);  // the lowest waiting rank: rank 0 waits for the gradient, rank 1 at its step 0
  CHECK(never_sent.step == 1);
}

TEST_CASE("messages out of order are reported where they are received, with the message that came") {
  CHECK_THROWS_WITH_AS(sw::check_schedule(SwappedReceives{}, 2, 2),
                       "shardwise::check_schedule: rank 1, step 0, recv_activation(microbatch 1, chunk 0) from "
                       "rank 0 (the next message on its channel is send_activation(microbatch 0, chunk 0) to rank "
                       "1): a receive expects another microbatch or chunk than the next message from that rank "
                       "(messages arrive in the order they were sent); receive in the order the peer sends",
                       sw::error);
}

TEST_CASE("each rule, on a hand-written table, at its rank and step") {
  auto const rank1 =
      sw::pipeline_actions{A::recv_activation(0, 0), A::forward(0), A::backward(0), A::send_gradient(0, 0)};
  SUBCASE("a message sent twice and received once") {
    auto const check = check_two_stages(
        {A::forward(0), A::send_activation(1, 0), A::send_activation(1, 0), A::recv_gradient(1, 0), A::backward(0)},
        rank1);
    CHECK(check.rule == schedule_rule::message_never_received);
    CHECK(check.rank == 0);
    CHECK(check.step == 2);
    CHECK(check.action == A::send_activation(1, 0));
  }
  SUBCASE("a send before the forward that computes it") {
    auto const check =
        check_two_stages({A::send_activation(1, 0), A::forward(0), A::recv_gradient(1, 0), A::backward(0)}, rank1);
    CHECK(check.rule == schedule_rule::send_before_compute);
    CHECK(check.rank == 0);
    CHECK(check.step == 0);
  }
  SUBCASE("a forward before its input") {
    auto const check =
        check_two_stages({A::forward(0), A::send_activation(1, 0), A::recv_gradient(1, 0), A::backward(0)},
                         {A::forward(0), A::recv_activation(0, 0), A::backward(0), A::send_gradient(0, 0)});
    CHECK(check.rule == schedule_rule::forward_before_input);
    CHECK(check.rank == 1);
    CHECK(check.step == 0);
  }
  SUBCASE("a backward before its gradient, and before its own forward") {
    auto const no_gradient =
        check_two_stages({A::forward(0), A::send_activation(1, 0), A::backward(0), A::recv_gradient(1, 0)}, rank1);
    CHECK(no_gradient.rule == schedule_rule::backward_before_gradient);
    CHECK(no_gradient.rank == 0);
    CHECK(no_gradient.step == 2);
    auto const no_forward = sw::simulate_table({{A::backward(0), A::forward(0)}}, {1, 1, 1});
    CHECK(no_forward.rule == schedule_rule::backward_before_forward);
    CHECK(no_forward.step == 0);
  }
  SUBCASE("a forward done twice") {
    auto const check = sw::simulate_table({{A::forward(0), A::forward(0), A::backward(0)}}, {1, 1, 1});
    CHECK(check.rule == schedule_rule::done_twice);
    CHECK(check.step == 1);
  }
  SUBCASE("a microbatch left out on both ranks") {
    auto const check =
        check_two_stages({A::forward(0), A::send_activation(1, 0), A::recv_gradient(1, 0), A::backward(0)}, rank1, 2);
    CHECK(check.rule == schedule_rule::never_computed);
    CHECK(check.rank == 0);
    CHECK(check.step == 4);  // after its last step
    CHECK(check.action == A::forward(1));
    CHECK_THROWS_WITH_AS(sw::check_schedule(sw::GPipe{}, 2, 0), doctest::Contains("0 microbatches on 2 stages"),
                         sw::error);
  }
  SUBCASE("a peer that does not hold the neighbouring stage, a microbatch out of range") {
    auto const wrong_peer =
        sw::simulate_table({{A::forward(0), A::send_activation(2, 0)}, {A::recv_activation(0, 0)}, {}}, {3, 1, 1});
    CHECK(wrong_peer.rule == schedule_rule::malformed_action);
    CHECK(wrong_peer.rank == 0);
    CHECK(wrong_peer.step == 1);
    CHECK(sw::simulate_table({{A::forward(0), A::backward(0)}}, {2, 1, 1}).rule ==
          schedule_rule::malformed_action);  // a list for one of two ranks
    auto const out_of_range = sw::simulate_table({{A::forward(0), A::backward(0), A::forward(1)}}, {1, 1, 1});
    CHECK(out_of_range.rule == schedule_rule::malformed_action);
    CHECK(out_of_range.step == 2);
  }
}

TEST_CASE("stage_split: even splits, explicit cuts, and counts that cannot be split, named") {
  sw::stage_split const even(8, 4);
  CHECK(even.stages() == 4);
  CHECK(even.of(0).first == 0);
  CHECK(even.of(3).first == 6);
  CHECK(even.of(3).count == 2);
  sw::stage_split const cut(5, std::vector<std::size_t>{1, 4});  // uneven on purpose: 1, 3 and 1 layers
  CHECK(cut.stages() == 3);
  CHECK(cut.of(1).first == 1);
  CHECK(cut.of(1).count == 3);
  CHECK(cut.of(2).count == 1);
  CHECK_THROWS_WITH_AS(sw::stage_split(6, 4), doctest::Contains("6 layers do not divide over 4 stages"), sw::error);
  CHECK_THROWS_WITH_AS(sw::stage_split(2, 4), doctest::Contains("4 stages for 2 layers"), sw::error);
  CHECK_THROWS_WITH_AS(sw::stage_split(5, std::vector<std::size_t>{3, 3}),
                       doctest::Contains("cut 1 at layer 3 leaves a stage without layers"), sw::error);
  CHECK_THROWS_WITH_AS((void)even.of(4), doctest::Contains("stage 4 of 4 stages does not exist"), sw::error);
}

TEST_CASE("split_microbatches: equal microbatches of whole rows, or the counts named") {
  std::vector<int> const batch{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};  // 6 rows of 2
  auto const parts = sw::split_microbatches(std::span<int const>(batch), 2, 3);
  REQUIRE(parts.size() == 3);
  CHECK(parts[1].front() == 4);
  CHECK(parts[1].size() == 4);
  CHECK_THROWS_WITH_AS(sw::split_microbatches(std::span<int const>(batch), 2, 4),
                       doctest::Contains("(6 rows of 2) does not divide into 4 microbatches"), sw::error);
  CHECK_THROWS_WITH_AS(sw::split_microbatches(std::span<int const>(batch), 5, 1),
                       doctest::Contains("does not divide into 1 microbatches of whole rows"), sw::error);
  static_assert(sw::microbatch_rows<8, 4>() == 2);
}
