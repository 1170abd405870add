#pragma once
// Pipeline schedules as types: GPipe, 1F1B, interleaved 1F1B, ZB-H1, ZBV and DualPipeV, each a constexpr function from
// (rank, stages, microbatches) to that rank's action table, and the concept a schedule of your own satisfies. Each
// table is proven deadlock-free by check.hpp, at compile time when the counts are static.
#include <algorithm>
#include <concepts>
#include <utility>
#include <vector>

#include "shardwise/pipeline/action.hpp"

namespace shardwise {

/// A schedule says how many model chunks each rank holds (`static constexpr int chunks_per_rank`).
template <class S>
concept schedule_chunks = requires {
  { S::chunks_per_rank } -> std::convertible_to<int>;
};

/// A schedule says which counts it can run: `supports(stages, microbatches)` (constexpr, returns bool).
template <class S>
concept schedule_counts = requires(S const& schedule, int count) {
  { schedule.supports(count, count) } -> std::same_as<bool>;
};

/// A schedule writes one rank's actions: `actions(rank, stages, microbatches)` (constexpr, returns
/// pipeline_actions). It is only asked for counts its supports() accepts.
template <class S>
concept schedule_actions = requires(S const& schedule, int count) {
  { schedule.actions(count, count, count) } -> std::same_as<pipeline_actions>;
};

/// What a pipeline schedule provides; GPipe, OneFOneB and Interleaved1F1B<V> are ones, and a type of your own
/// with the three members is one too. For a compile-time check (checked_schedule) it must also be a literal
/// type whose default-constructed value the members use in constant expressions.
template <class S>
concept pipeline_schedule =
    std::default_initializable<S> && schedule_chunks<S> && schedule_counts<S> && schedule_actions<S>;

/// GPipe: every rank runs the forwards of all microbatches, then their backwards in the same order. Every
/// microbatch's activations are held at once (peak in flight: microbatches). Runs any counts.
struct GPipe {
  /// One model chunk per rank.
  static constexpr int chunks_per_rank = 1;

  /// Any stage and microbatch counts of at least one.
  static constexpr bool supports(int stages, int microbatches) { return stages >= 1 && microbatches >= 1; }

  /// Rank `rank`'s forwards of microbatches 0..m-1, then its backwards of 0..m-1.
  static constexpr pipeline_actions actions(int rank, int stages, int microbatches) {
    action_writer writer({stages, chunks_per_rank, microbatches}, rank);
    for (int microbatch = 0; microbatch < microbatches; ++microbatch) writer.forward(microbatch);
    for (int microbatch = 0; microbatch < microbatches; ++microbatch) writer.backward(microbatch);
    return std::move(writer).take();
  }
};

/// 1F1B (PipeDream-Flush, PyTorch's Schedule1F1B): rank r warms up with stages - 1 - r forwards, then
/// alternates one forward and one backward, then cools down with the remaining backwards. Rank r holds at most
/// min(stages - r, microbatches) microbatches' activations. Fewer microbatches than stages work: the warm-up
/// shrinks to the microbatches there are (PyTorch hung here, torchtitan #775, then refused it, PR #144702).
struct OneFOneB {
  /// One model chunk per rank.
  static constexpr int chunks_per_rank = 1;

  /// Any stage and microbatch counts of at least one.
  static constexpr bool supports(int stages, int microbatches) { return stages >= 1 && microbatches >= 1; }

  /// Rank `rank`'s warm-up forwards, steady forward/backward pairs and cool-down backwards.
  static constexpr pipeline_actions actions(int rank, int stages, int microbatches) {
    action_writer writer({stages, chunks_per_rank, microbatches}, rank);
    int const warmup = std::min(stages - 1 - rank, microbatches);
    int const steady = microbatches - warmup;
    for (int microbatch = 0; microbatch < warmup; ++microbatch) writer.forward(microbatch);
    for (int i = 0; i < steady; ++i) {
      writer.forward(warmup + i);
      writer.backward(i);
    }
    for (int microbatch = steady; microbatch < microbatches; ++microbatch) writer.backward(microbatch);
    return std::move(writer).take();
  }
};

/// Interleaved 1F1B (Megatron-LM's interleaved schedule, PyTorch's ScheduleInterleaved1F1B) with V model chunks
/// per rank: chunk c of rank r is stage c * stages + r. Microbatches go through in groups of `stages`: a group
/// runs chunk 0 of each of its microbatches, then chunk 1, and so on; backwards run the chunks in reverse.
/// Rank r warms up with 2 * (stages - 1 - r) + (V - 1) * stages chunk-forwards, then alternates, then cools
/// down. The microbatches must be a multiple of the stages (Megatron's requirement: the groups must be whole).
/// Megatron turns everything into warm-up when microbatches == stages; this keeps the formula there too, which
/// holds fewer activations and passes the same check.
template <int V>
struct Interleaved1F1B {
  static_assert(V >= 1, "shardwise::Interleaved1F1B<V>: V is the number of model chunks per rank; use 1 or more");

  /// V model chunks per rank.
  static constexpr int chunks_per_rank = V;

  /// Microbatches a positive multiple of the stages.
  static constexpr bool supports(int stages, int microbatches) {
    return stages >= 1 && microbatches >= 1 && microbatches % stages == 0;
  }

  /// Rank `rank`'s warm-up chunk-forwards, steady forward/backward pairs and cool-down backwards; an empty
  /// list for counts supports() refuses.
  static constexpr pipeline_actions actions(int rank, int stages, int microbatches) {
    action_writer writer({stages, chunks_per_rank, microbatches}, rank);
    if (!supports(stages, microbatches)) return std::move(writer).take();
    int const total = microbatches * V;
    int const warmup = std::min(2 * (stages - 1 - rank) + (V - 1) * stages, total);
    int const steady = total - warmup;
    for (int k = 0; k < warmup; ++k) write_forward(writer, k, stages);
    for (int i = 0; i < steady; ++i) {
      write_forward(writer, warmup + i, stages);
      write_backward(writer, i, stages);
    }
    for (int k = steady; k < total; ++k) write_backward(writer, k, stages);
    return std::move(writer).take();
  }

 private:
  // The k-th chunk-forward of every rank: within a group of stages * V, `stages` microbatches per chunk.
  static constexpr void write_forward(action_writer& writer, int k, int stages) {
    writer.forward(microbatch_of(k, stages), (k % (stages * V)) / stages);
  }
  // The k-th chunk-backward: the same microbatches, the chunks from last to first.
  static constexpr void write_backward(action_writer& writer, int k, int stages) {
    writer.backward(microbatch_of(k, stages), V - 1 - (k % (stages * V)) / stages);
  }
  static constexpr int microbatch_of(int k, int stages) { return k / (stages * V) * stages + k % stages; }
};

/// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024; PyTorch's ScheduleInterleavedZeroBubble at one
/// chunk per rank): 1F1B's order of forwards and input-gradient backwards (B), with each weight-gradient backward
/// (W) after its B, rank r holding back r of them: rank 0 runs W as soon as B is done, into the time it would wait
/// for the next gradient, while the last rank runs its Bs first, which the others wait on. The messages are
/// exactly 1F1B's (W sends nothing), so it runs wherever 1F1B does. The bubble is (stages - 1)(F + B - W) against
/// 1F1B's (stages - 1)(F + B + W): a third of it when the three take equal time. Rank r holds at most
/// min(stages, microbatches) microbatches between forward and W, as 1F1B's rank 0 does. Runs any counts.
struct ZeroBubbleH1 {
  /// One model chunk per rank.
  static constexpr int chunks_per_rank = 1;

  /// Any stage and microbatch counts of at least one.
  static constexpr bool supports(int stages, int microbatches) { return stages >= 1 && microbatches >= 1; }

  /// Rank `rank`'s warm-up forwards, then per microbatch i: the next forward, B(i) and W(i - rank); then the
  /// Ws held back.
  static constexpr pipeline_actions actions(int rank, int stages, int microbatches) {
    action_writer writer({stages, chunks_per_rank, microbatches}, rank);
    int const warmup = std::min(stages - 1 - rank, microbatches);
    for (int microbatch = 0; microbatch < warmup; ++microbatch) writer.forward(microbatch);
    for (int i = 0; i < microbatches; ++i) {
      if (warmup + i < microbatches) writer.forward(warmup + i);
      writer.backward_input(i);
      if (i >= rank) writer.backward_weight(i - rank);
    }
    for (int microbatch = std::max(microbatches - rank, 0); microbatch < microbatches; ++microbatch)
      writer.backward_weight(microbatch);
    return std::move(writer).take();
  }
};

/// The messages from one rank to another that may be unreceived before a send waits, as schedule S declares
/// (`static constexpr int in_flight_per_peer`), or -1 (unbounded) when it declares none.
template <class S>
constexpr int in_flight_per_peer() {
  if constexpr (requires { S::in_flight_per_peer; })
    return static_cast<int>(S::in_flight_per_peer);
  else
    return -1;
}

/// Schedule S, checked (and run) as though a rank may have at most K messages to a peer unreceived before its
/// next send to that peer waits: K eager buffer slots per peer, K = 0 a rendezvous send (MPI_Ssend). A table that
/// passes unbounded can deadlock at a small K: each rank waits in a send for the other to receive.
template <class S, int K>
struct bounded : S {
  static_assert(K >= 0,
                "shardwise::bounded<Schedule, K>: K is how many messages to a peer may be unreceived; use 0 or more");
  /// The bound the check uses.
  static constexpr int in_flight_per_peer = K;
};

/// Where schedule S puts the stages (`static constexpr stage_placement placement`; loop when it declares none).
template <class S>
constexpr stage_placement placement_of() {
  if constexpr (requires { S::placement; })
    return S::placement;
  else
    return stage_placement::loop;
}

/// The shape schedule S runs with these counts: its chunks per rank and its placement.
template <class S>
constexpr pipeline_shape shape_of(int stages, int microbatches) {
  return {stages, static_cast<int>(S::chunks_per_rank), microbatches, placement_of<S>()};
}

/// ZBV (Qi et al., section 6; PyTorch's ScheduleZBVZeroBubble): two chunks per rank in the V placement, so the
/// model runs down the ranks on chunk 0 and back up on chunk 1 (rank 0 holds the embedding and the head; the turn
/// is a move on the last rank), with the backward split into B and W. The order is PyTorch's, padded to
/// 2 * stages - 1 microbatches and the padding dropped: warm-up forwards of chunk 0, then of both chunks, then each
/// microbatch's F, B, W per chunk, and a cool-down of Bs and the Ws held back. With equal F, B and W and enough
/// microbatches its bubble is near zero; every rank holds about 2 * stages half-size chunk-microbatches, as 1F1B's
/// rank 0 holds stages whole ones. Layers must divide into 2 * stages stages.
struct ZeroBubbleV {
  /// Two model chunks per rank.
  static constexpr int chunks_per_rank = 2;
  /// Chunk 0 of rank r is stage r, chunk 1 stage 2 * stages - 1 - r.
  static constexpr stage_placement placement = stage_placement::v;

  /// Any stage and microbatch counts of at least one.
  static constexpr bool supports(int stages, int microbatches) { return stages >= 1 && microbatches >= 1; }

  /// Rank `rank`'s table.
  static constexpr pipeline_actions actions(int rank, int stages, int microbatches) {
    table t{action_writer(shape_of<ZeroBubbleV>(stages, microbatches), rank), microbatches};
    int const padded = std::max(2 * stages - 1, microbatches);
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;
    for (int i = 0; i < 2 * (stages - rank) - 1; ++i) t.forward(f0++, 0);
    for (int i = 0; i < rank; ++i) t.forward(f1++, 1), t.forward(f0++, 0);
    for (int i = 0; i < stages - rank; ++i) t.forward(f1++, 1), t.input(b1, 1), t.weight(b1++, 1);
    while (f1 < f0 || f0 < padded) {
      if (f0 < padded) t.forward(f0++, 0);
      t.input(b0, 0), t.weight(b0++, 0);
      t.forward(f1++, 1), t.input(b1, 1), t.weight(b1++, 1);
    }
    int w0 = b0, w1 = b1;
    for (int i = 0; i < rank; ++i) t.input(b0++, 0), t.input(b1++, 1);
    for (int i = 0; i < stages - rank; ++i) t.input(b0++, 0), t.weight(w0++, 0);
    while (w1 < b1) t.weight(w1++, 1);
    while (w0 < b0) t.weight(w0++, 0);
    return std::move(t.writer).take();
  }

 private:
  // The writer, dropping the padding's microbatches.
  struct table {
    action_writer writer;
    int microbatches;
    constexpr void forward(int m, int chunk) {
      if (m < microbatches) writer.forward(m, chunk);
    }
    constexpr void input(int m, int chunk) {
      if (m < microbatches) writer.backward_input(m, chunk);
    }
    constexpr void weight(int m, int chunk) {
      if (m < microbatches) writer.backward_weight(m, chunk);
    }
  };
};

/// DualPipeV (DeepSeek-V3's DualPipe cut in half; PyTorch's ScheduleDualPipeV, torchtitan's DualPipeV): ZBV's V
/// placement, with PyTorch's order. Warm-up forwards of chunk 0, then of both chunks; then pairs of one chunk's
/// forward and the other's whole backward (DualPipe overlaps each pair's computation with its communication; here
/// they run one after the other), and a cool-down whose last backwards split into B and W to fill the bubble. Needs
/// at least 2 * stages microbatches; every rank holds at most about 2 * stages + 1 half-size chunk-microbatches.
struct DualPipeV {
  /// Two model chunks per rank.
  static constexpr int chunks_per_rank = 2;
  /// Chunk 0 of rank r is stage r, chunk 1 stage 2 * stages - 1 - r.
  static constexpr stage_placement placement = stage_placement::v;

  /// At least as many microbatches as model stages (2 * stages), as PyTorch requires.
  static constexpr bool supports(int stages, int microbatches) { return stages >= 1 && microbatches >= 2 * stages; }

  /// Rank `rank`'s table: PyTorch's eight steps.
  static constexpr pipeline_actions actions(int rank, int stages, int microbatches) {
    table t{action_writer(shape_of<DualPipeV>(stages, microbatches), rank)};
    int const later = stages - rank - 1;  // ranks after this one
    for (int i = 0; i < 2 * later; ++i) t.forward(0);
    for (int i = 0; i < rank + 1; ++i) t.forward(0), t.forward(1);
    for (int i = 0; i < later; ++i) t.input(1), t.weight(), t.forward(1);
    for (int i = 0; i < microbatches - 2 * stages + rank + 1; ++i) {
      t.forward(0), t.backward(1);  // on the last rank, PyTorch's first pair is not overlapped: the same order here
      t.forward(1), t.backward(0);
    }
    for (int i = 0; i < later; ++i) t.backward(1), t.forward(1), t.backward(0);
    bool split = false;  // the second half of these backwards split into B and W
    for (int i = 0; i < rank + 1; ++i) {
      if (i == (rank + 1) / 2 && rank % 2 == 1) split = true;
      split ? t.input(1) : t.backward(1);
      if (i == (rank + 1) / 2 && rank % 2 == 0) split = true;
      split ? t.input(0) : t.backward(0);
    }
    for (int i = 0; i < later; ++i) {
      t.weight();
      split ? t.input(0) : t.backward(0);
    }
    for (int i = 0; i < rank + 1; ++i) t.weight();
    return std::move(t.writer).take();
  }

 private:
  // The writer, counting each chunk's microbatches, with the Ws waiting for their turn (oldest B first).
  struct table {
    action_writer writer;
    int forwards[2] = {0, 0};
    int backwards[2] = {0, 0};
    std::vector<std::pair<int, int>> waiting{};  // (microbatch, chunk) of each B whose W has not run
    constexpr void forward(int chunk) { writer.forward(forwards[chunk]++, chunk); }
    constexpr void backward(int chunk) { writer.backward(backwards[chunk]++, chunk); }
    constexpr void input(int chunk) {
      waiting.emplace_back(backwards[chunk], chunk);
      writer.backward_input(backwards[chunk]++, chunk);
    }
    constexpr void weight() {
      if (waiting.empty()) return;
      writer.backward_weight(waiting.front().first, waiting.front().second);
      waiting.erase(waiting.begin());
    }
  };
};

/// Every rank's actions under `schedule`: element r is rank r's list.
template <pipeline_schedule S>
constexpr std::vector<pipeline_actions> action_table(S const& schedule, int stages, int microbatches) {
  std::vector<pipeline_actions> table;
  for (int rank = 0; rank < stages; ++rank) table.push_back(schedule.actions(rank, stages, microbatches));
  return table;
}

/// The most microbatch-chunks whose forward has run and whose backward (or W, when split) has not, over the list:
/// how many microbatches' activations, or what W keeps of them, the rank holds at its peak.
constexpr int peak_in_flight(pipeline_actions const& actions) {
  int held = 0;
  int peak = 0;
  for (auto const& action : actions) {
    if (action.kind == action_kind::forward) peak = std::max(peak, ++held);
    if (action.kind == action_kind::backward || action.kind == action_kind::backward_weight) --held;
  }
  return peak;
}

/// The most microbatch-chunks whose B has run and whose W has not: how many weight-gradient stashes (each layer's
/// output gradient, beside the input it keeps) the rank holds at its peak.
constexpr int peak_weight_pending(pipeline_actions const& actions) {
  int held = 0;
  int peak = 0;
  for (auto const& action : actions) {
    if (action.kind == action_kind::backward_input) peak = std::max(peak, ++held);
    if (action.kind == action_kind::backward_weight) --held;
  }
  return peak;
}

}  // namespace shardwise
