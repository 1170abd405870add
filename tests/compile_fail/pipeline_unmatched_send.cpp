// A hand-written pipeline schedule whose rank 1 sends one gradient more than rank 0 receives: the message would
// be left in flight (an MPI request never completed), so the schedule does not compile.
#include <shardwise/pipeline/schedule.hpp>
namespace sw = shardwise;
using A = sw::pipeline_action;
struct TwoStages {
  static constexpr int chunks_per_rank = 1;
  static constexpr bool supports(int stages, int microbatches) { return stages == 2 && microbatches == 1; }
  static constexpr sw::pipeline_actions actions(int rank, int, int) {
    if (rank == 0) return {A::forward(0), A::send_activation(1, 0), A::recv_gradient(1, 0), A::backward(0)};
#ifdef SHARDWISE_SHOULD_FAIL
    return {A::recv_activation(0, 0), A::forward(0), A::backward(0), A::send_gradient(0, 0), A::send_gradient(0, 0)};
#else
    return {A::recv_activation(0, 0), A::forward(0), A::backward(0), A::send_gradient(0, 0)};
#endif
  }
};
template struct sw::checked_schedule<TwoStages, 2, 1>;
