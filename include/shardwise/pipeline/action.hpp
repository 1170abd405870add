#pragma once
// The vocabulary of pipeline schedules: one rank's action table is a list of forwards, backwards (whole, or split
// into the input gradient B and the weight gradient W, as zero-bubble schedules run them) and the point-to-point
// sends and receives between neighbouring stages. A schedule (schedules.hpp) writes the list;
// the checker (check.hpp) runs every rank's list against the others before any data moves.
#include <string>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"

namespace shardwise {

/// What one step of a rank's pipeline schedule does. Sends are buffered (they never wait, as MPI_Isend);
/// receives wait until the matching message has arrived.
enum class action_kind : unsigned char {
  forward,          ///< run a microbatch through one of this rank's model chunks
  backward,         ///< the backward of that forward
  send_activation,  ///< a forward's output to the rank of the next stage
  recv_activation,  ///< a forward's input from the rank of the previous stage
  send_gradient,    ///< a backward's input gradient to the rank of the previous stage
  recv_gradient,    ///< a backward's output gradient from the rank of the next stage
  backward_input,   ///< B: the part of the backward that gives the input gradient (what the previous stage waits on)
  backward_weight,  ///< W: the rest, the parameters' gradients; after its B, and it sends nothing
};

/// One step of one rank's schedule. `chunk` is a model chunk of this rank (always 0 without interleaving):
/// for a send, the chunk whose forward or backward produced the data; for a receive, the chunk that will use it.
struct pipeline_action {
  action_kind kind = action_kind::forward;  ///< what the step does
  int microbatch = 0;                       ///< which microbatch, 0..microbatches-1
  int chunk = 0;                            ///< which of this rank's model chunks, 0..chunks_per_rank-1
  int peer = -1;                            ///< the rank sent to or received from; -1 for forward and backward

  /// Runs microbatch `microbatch` through this rank's chunk `chunk`.
  static constexpr pipeline_action forward(int microbatch, int chunk = 0) {
    return {action_kind::forward, microbatch, chunk, -1};
  }
  /// The backward of forward(microbatch, chunk).
  static constexpr pipeline_action backward(int microbatch, int chunk = 0) {
    return {action_kind::backward, microbatch, chunk, -1};
  }
  /// B: the input-gradient half of backward(microbatch, chunk); its weight-gradient half is backward_weight.
  static constexpr pipeline_action backward_input(int microbatch, int chunk = 0) {
    return {action_kind::backward_input, microbatch, chunk, -1};
  }
  /// W: the weight-gradient half of backward(microbatch, chunk), any time after backward_input of the same.
  static constexpr pipeline_action backward_weight(int microbatch, int chunk = 0) {
    return {action_kind::backward_weight, microbatch, chunk, -1};
  }
  /// Sends forward(microbatch, chunk)'s output to rank `to`, which holds the next stage.
  static constexpr pipeline_action send_activation(int to, int microbatch, int chunk = 0) {
    return {action_kind::send_activation, microbatch, chunk, to};
  }
  /// Receives forward(microbatch, chunk)'s input from rank `from`, which holds the previous stage.
  static constexpr pipeline_action recv_activation(int from, int microbatch, int chunk = 0) {
    return {action_kind::recv_activation, microbatch, chunk, from};
  }
  /// Sends backward(microbatch, chunk)'s input gradient to rank `to`, which holds the previous stage.
  static constexpr pipeline_action send_gradient(int to, int microbatch, int chunk = 0) {
    return {action_kind::send_gradient, microbatch, chunk, to};
  }
  /// Receives backward(microbatch, chunk)'s output gradient from rank `from`, which holds the next stage.
  static constexpr pipeline_action recv_gradient(int from, int microbatch, int chunk = 0) {
    return {action_kind::recv_gradient, microbatch, chunk, from};
  }

  /// Equal when every field is.
  friend constexpr bool operator==(pipeline_action const&, pipeline_action const&) = default;
};

/// One rank's actions, in the order it runs them.
using pipeline_actions = std::vector<pipeline_action>;

/// Which model stages a rank's chunks are.
enum class stage_placement : unsigned char {
  loop,  ///< chunk c of rank r is stage c * stages + r (Megatron's and PyTorch's interleaved schedules)
  v,     ///< two chunks: chunk 0 of rank r is stage r, chunk 1 stage 2 * stages - 1 - r (ZBV: rank 0 holds both ends)
};

/// The counts a schedule runs with. `stages` is the number of pipeline ranks (the size of the "pp" axis); with
/// `chunks_per_rank` = V the model is cut into stages * V pieces (stage indices), which `placement` puts on the
/// ranks' chunks.
struct pipeline_shape {
  int stages = 1;           ///< pipeline ranks
  int chunks_per_rank = 1;  ///< model chunks per rank (V of interleaved 1F1B, 2 of ZBV; 1 otherwise)
  int microbatches = 1;     ///< microbatches per step
  stage_placement placement = stage_placement::loop;  ///< which stages a rank's chunks are

  /// How many pieces the model is cut into.
  [[nodiscard]] constexpr int model_stages() const { return stages * chunks_per_rank; }
  /// The stage index of chunk `chunk` on rank `rank`.
  [[nodiscard]] constexpr int stage_of(int rank, int chunk) const {
    if (placement == stage_placement::v) return chunk == 0 ? rank : 2 * stages - 1 - rank;
    return chunk * stages + rank;
  }
  /// The rank that holds stage index `stage`.
  [[nodiscard]] constexpr int rank_of(int stage) const {
    if (placement == stage_placement::v) return stage < stages ? stage : 2 * stages - 1 - stage;
    return stage % stages;
  }
  /// The chunk that stage index `stage` is on its rank.
  [[nodiscard]] constexpr int chunk_of(int stage) const {
    if (placement == stage_placement::v) return stage < stages ? 0 : 1;
    return stage / stages;
  }
  /// Whether `stage` takes the model's input (it receives no activation).
  [[nodiscard]] constexpr bool is_first(int stage) const { return stage == 0; }
  /// Whether `stage` computes the loss (it receives no gradient).
  [[nodiscard]] constexpr bool is_last(int stage) const { return stage == model_stages() - 1; }
};

/// Writes one rank's actions a compute step at a time, with the communication each needs around it: a
/// forward is preceded by its activation's receive and followed by its output's send (where those stages
/// exist), a backward likewise with gradients. The built-in schedules use it; so can a schedule of your own.
class action_writer {
 public:
  /// Starts an empty list for rank `rank` of a pipeline of `shape`.
  constexpr action_writer(pipeline_shape shape, int rank) : shape_(shape), rank_(rank) {}

  /// recv_activation (unless the first stage), forward, send_activation (unless the last stage).
  constexpr void forward(int microbatch, int chunk = 0) {
    int const stage = shape_.stage_of(rank_, chunk);
    if (!shape_.is_first(stage))
      actions_.push_back(pipeline_action::recv_activation(shape_.rank_of(stage - 1), microbatch, chunk));
    actions_.push_back(pipeline_action::forward(microbatch, chunk));
    if (!shape_.is_last(stage))
      actions_.push_back(pipeline_action::send_activation(shape_.rank_of(stage + 1), microbatch, chunk));
  }

  /// recv_gradient (unless the last stage), backward, send_gradient (unless the first stage).
  constexpr void backward(int microbatch, int chunk = 0) {
    backward_with(pipeline_action::backward(microbatch, chunk));
  }

  /// recv_gradient (unless the last stage), B, send_gradient (unless the first stage): backward_weight later.
  constexpr void backward_input(int microbatch, int chunk = 0) {
    backward_with(pipeline_action::backward_input(microbatch, chunk));
  }

  /// W alone: it needs no message.
  constexpr void backward_weight(int microbatch, int chunk = 0) {
    actions_.push_back(pipeline_action::backward_weight(microbatch, chunk));
  }

  /// The list written so far.
  [[nodiscard]] constexpr pipeline_actions take() && { return std::move(actions_); }

 private:
  constexpr void backward_with(pipeline_action computed) {
    int const stage = shape_.stage_of(rank_, computed.chunk);
    if (!shape_.is_last(stage))
      actions_.push_back(
          pipeline_action::recv_gradient(shape_.rank_of(stage + 1), computed.microbatch, computed.chunk));
    actions_.push_back(computed);
    if (!shape_.is_first(stage))
      actions_.push_back(
          pipeline_action::send_gradient(shape_.rank_of(stage - 1), computed.microbatch, computed.chunk));
  }

  pipeline_shape shape_;
  int rank_;
  pipeline_actions actions_;
};

/// Whether `kind` computes (a forward, a backward or one of its halves) rather than moves a message.
constexpr bool computes(action_kind kind) {
  return kind == action_kind::forward || kind == action_kind::backward || kind == action_kind::backward_input ||
         kind == action_kind::backward_weight;
}

namespace detail {

/// Whether `kind` receives a message, sends one, or moves a gradient (not an activation).
constexpr bool is_receive(action_kind kind) {
  return kind == action_kind::recv_activation || kind == action_kind::recv_gradient;
}
constexpr bool is_send(action_kind kind) {
  return kind == action_kind::send_activation || kind == action_kind::send_gradient;
}
constexpr bool carries_gradient(action_kind kind) {
  return kind == action_kind::send_gradient || kind == action_kind::recv_gradient;
}

[[nodiscard]] inline char const* action_name(action_kind kind) {
  switch (kind) {
    case action_kind::forward:
      return "forward";
    case action_kind::backward:
      return "backward";
    case action_kind::send_activation:
      return "send_activation";
    case action_kind::recv_activation:
      return "recv_activation";
    case action_kind::send_gradient:
      return "send_gradient";
    case action_kind::recv_gradient:
      return "recv_gradient";
    case action_kind::backward_input:
      return "backward_input";
    case action_kind::backward_weight:
      return "backward_weight";
  }
  return "unknown action";
}

/// "recv_gradient(microbatch 0, chunk 0) from rank 1", for run-time messages.
[[nodiscard]] inline std::string describe(pipeline_action const& action) {
  std::string text = concat(action_name(action.kind), "(microbatch ", action.microbatch, ", chunk ", action.chunk, ")");
  if (!computes(action.kind)) text += concat(is_send(action.kind) ? " to rank " : " from rank ", action.peer);
  return text;
}

}  // namespace detail
}  // namespace shardwise
