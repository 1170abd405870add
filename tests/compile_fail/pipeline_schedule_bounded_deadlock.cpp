// A B/W table at 2 stages and 4 microbatches that runs with unbounded sends and with 2 messages in flight per peer,
// and deadlocks with 1: rank 0 waits in its send of activation 3 while rank 1 waits in its send of gradient 1.
#include <shardwise/pipeline/schedule.hpp>
namespace sw = shardwise;
struct ForwardsFirstSplitBackward {
  static constexpr int chunks_per_rank = 1;
#ifdef SHARDWISE_SHOULD_FAIL
  static constexpr int in_flight_per_peer = 1;
#else
  static constexpr int in_flight_per_peer = 2;
#endif
  static constexpr bool supports(int stages, int microbatches) { return stages == 2 && microbatches == 4; }
  static constexpr sw::pipeline_actions actions(int rank, int stages, int microbatches) {
    sw::action_writer w({stages, chunks_per_rank, microbatches}, rank);
    if (rank == 0) {  // F0 sA0 F1 sA1 F2 sA2 F3 sA3 rG0 B0 rG1 B1 W0 W1 rG2 B2 W2 rG3 B3 W3
      for (int m = 0; m < 4; ++m) w.forward(m);
      w.backward_input(0), w.backward_input(1), w.backward_weight(0), w.backward_weight(1);
    } else {  // rA0 F0 rA1 F1 B0 sG0 B1 sG1 W0 W1 rA2 F2 rA3 F3 B2 sG2 W2 B3 sG3 W3
      w.forward(0), w.forward(1), w.backward_input(0), w.backward_input(1);
      w.backward_weight(0), w.backward_weight(1), w.forward(2), w.forward(3);
    }
    w.backward_input(2), w.backward_weight(2), w.backward_input(3), w.backward_weight(3);
    return std::move(w).take();
  }
};
template struct sw::checked_schedule<ForwardsFirstSplitBackward, 2, 4>;
