#pragma once
// Runs one pipeline step on this rank: its action table (from a schedule, checked on every rank before any
// data moves) drives its model chunks, one microbatch at a time. Each forward's activations are moved out of
// the chunk into that microbatch's saved_activations, so the chunk can run the next microbatch's forward before
// this one's backward; activations and gradients cross to the neighbouring stages over the pipeline axis.
#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/collectives/collectives.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/nn/activation.hpp"
#include "shardwise/nn/module_call.hpp"
#include "shardwise/pipeline/schedule.hpp"
#include "shardwise/plan/saved.hpp"

namespace shardwise {

namespace detail {

/// What one rank holds for one (chunk, microbatch) between the steps of its table.
template <class Chunk, class X>
struct microbatch_slot {
  X input{};                        ///< received activation (or the first stage's input)
  X output{};                       ///< forward output waiting to be sent
  X gradient{};                     ///< received output gradient (or the loss's)
  X input_gradient{};               ///< backward's result waiting to be sent
  saved_activations<Chunk> kept{};  ///< the forward's activations, until the backward
};

/// The message tag of (microbatch, receiving stage, direction): distinct per message between two ranks, so a
/// receive can only take the message it names. The receiving stage, because sender and receiver number their
/// chunks differently (with interleaving, chunk 0 of the last rank feeds chunk 1 of the first).
inline int pipeline_tag(pipeline_shape const& shape, int microbatch, int receiving_stage, bool gradient) {
  return (microbatch * shape.model_stages() + receiving_stage) * 2 + (gradient ? 1 : 0);
}

/// Sends without waiting for the receiver: the schedules are proven with buffered sends (an MPI_Send of a large
/// message waits for its receive, and two neighbours sending to each other would wait forever).
template <class Mesh, class X>
void pipeline_send(Mesh const& pp, X const& x, int to, int tag) {
  auto const& comm = pp.comm(0);
  auto const shape = shape_of(x.local);
  auto const bytes = shape.elements() * sizeof(element_t<decltype(x.local)>);
  if constexpr (requires { comm.post_bytes(x.local.data(), bytes, shape, to, tag); })
    comm.post_bytes(x.local.data(), bytes, shape, to, tag);
  else
    comm.send_bytes(x.local.data(), bytes, shape, to, tag);  // the shared-memory meshes buffer every send
}

/// Waits for the sends pipeline_send left in flight (MPI).
template <class Mesh>
void pipeline_finish_sends(Mesh const& pp) {
  if constexpr (requires { pp.comm(0).finish_sends(); }) pp.comm(0).finish_sends();
}

template <class Mesh, class X>
void pipeline_recv(Mesh const& pp, X& x, int from, int tag) {
  recv(pp, x.local, from, tag);
}

}  // namespace detail

/// Runs this rank's part of one pipeline step on the 1-D mesh `pp` (the pipeline axis), as `schedule` orders
/// it for pp.size() stages and `microbatches` microbatches:
/// - `chunks`: this rank's model chunks; chunk c is stage c * pp.size() + pp.rank() of the model (one chunk
///   unless the schedule interleaves). Each is a module whose forward takes and returns an activation of type
///   X, called through sw::forward / sw::backward (its plan entries apply).
/// - `input(m)`: microbatch m's input to the model's first stage (called on the rank that holds it).
/// - `loss_gradient(m, y)`: on the rank of the last stage, the gradient of microbatch m's loss with respect to
///   its output y (record the loss there).
/// Parameter gradients accumulate in the chunks, microbatch by microbatch in the order of each rank's table.
/// The schedule is checked first, on every rank alike (sw::check_schedule), so a schedule that would hang
/// throws before any data moves.
template <pipeline_schedule Schedule, class Mesh, class Chunk, class Input, class LossGradient>
void run_pipeline_step(Schedule const& schedule, Mesh const& pp, std::span<Chunk> chunks, int microbatches,
                       Input&& input, LossGradient&& loss_gradient) {
  int const stages = pp.size(), rank = pp.rank();
  check_schedule(schedule, stages, microbatches);
  pipeline_shape const shape{stages, Schedule::chunks_per_rank, microbatches};
  if (microbatches * shape.model_stages() * 2 > 16384)
    detail::fail("shardwise::run_pipeline_step: ", microbatches, " microbatches over ", shape.model_stages(),
                 " stages need more message tags than the mesh has (16384); use fewer microbatches per step");
  if (chunks.size() != static_cast<std::size_t>(shape.chunks_per_rank))
    detail::fail("shardwise::run_pipeline_step: rank ", rank, " holds ", chunks.size(),
                 " model chunks but the schedule runs ", shape.chunks_per_rank,
                 " per rank; give each rank one chunk per schedule chunk");
  using X = std::remove_cvref_t<decltype(input(0))>;
  std::vector<std::vector<detail::microbatch_slot<Chunk, X>>> slots(chunks.size());
  for (auto& per_chunk : slots) per_chunk.resize(static_cast<std::size_t>(microbatches));
  auto slot_of = [&](int chunk, int microbatch) -> auto& {
    return slots[static_cast<std::size_t>(chunk)][static_cast<std::size_t>(microbatch)];
  };
  for (pipeline_action const& action : schedule.actions(rank, stages, microbatches)) {
    auto& chunk = chunks[static_cast<std::size_t>(action.chunk)];
    auto& slot = slot_of(action.chunk, action.microbatch);
    int const stage = shape.stage_of(rank, action.chunk);
    int const receiving_stage = action.kind == action_kind::send_activation ? stage + 1
                                : action.kind == action_kind::send_gradient ? stage - 1
                                                                            : stage;
    bool const gradient = action.kind == action_kind::send_gradient || action.kind == action_kind::recv_gradient;
    int const tag = detail::pipeline_tag(shape, action.microbatch, receiving_stage, gradient);
    switch (action.kind) {
      case action_kind::forward: {
        X y = forward(chunk, shape.is_first(stage) ? input(action.microbatch) : slot.input);
        slot.input = X{};
        slot.kept.take_from(chunk);
        if (shape.is_last(stage))
          slot.gradient = loss_gradient(action.microbatch, y);
        else
          slot.output = std::move(y);
        break;
      }
      case action_kind::backward: {
        slot.kept.give_back(chunk);
        X dx = backward(chunk, slot.gradient);
        slot.gradient = X{};
        drop_saved_activations(chunk);  // this microbatch's activations are done
        if (!shape.is_first(stage)) slot.input_gradient = std::move(dx);
        break;
      }
      case action_kind::send_activation:
        if (action.peer == rank)  // the next stage is this rank's too (one rank, interleaved): hand it over
          slot_of(shape.chunk_of(stage + 1), action.microbatch).input = std::move(slot.output);
        else
          detail::pipeline_send(pp, slot.output, action.peer, tag);
        slot.output = X{};
        break;
      case action_kind::send_gradient:
        if (action.peer == rank)
          slot_of(shape.chunk_of(stage - 1), action.microbatch).gradient = std::move(slot.input_gradient);
        else
          detail::pipeline_send(pp, slot.input_gradient, action.peer, tag);
        slot.input_gradient = X{};
        break;
      case action_kind::recv_activation:
        if (action.peer != rank) detail::pipeline_recv(pp, slot.input, action.peer, tag);
        break;
      case action_kind::recv_gradient:
        if (action.peer != rank) detail::pipeline_recv(pp, slot.gradient, action.peer, tag);
        break;
    }
  }
  detail::pipeline_finish_sends(pp);
}

}  // namespace shardwise
