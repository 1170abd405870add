// Pipeline steps on the MPI mesh (CTest runs this under mpiexec -n 1, 2, 4) against the unsharded run
// (cases/pipeline_cases.hpp): activations and gradients cross between processes with non-blocking sends.
#include <doctest/doctest.h>

#include <shardwise/mesh/mpi/comm.hpp>

#include "cases/pipeline_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("run_pipeline_step: GPipe, 1F1B, ZB-H1, ZBV and interleaved 1F1B equal the unsharded run, MPI mesh") {
  auto const world = worlds::mpi();
  auto const pp = shardwise::make_mesh<"pp">(world, {world.size()});
  pipeline_cases::check_all(pp);
  pipeline_cases::check_refusal(pp);
  pipeline_cases::check_disagreement(pp);
}

TEST_CASE("MPI sends posted without waiting are freed once received, not at the end of the step") {
  auto const world = shardwise::mpi_world();  // the MPI backend itself: its sends in flight
  if (world.size() < 2) return;               // needs a peer; the 2- and 4-rank runs check it
  std::vector<float> message(1 << 16, 1.0f);  // 256 KiB: above the eager limit, so MPI waits for the receiver
  shardwise::extents const shape{message.size()};
  int const rounds = 8;
  for (int round = 0; round < rounds; ++round) {
    if (world.rank() == 0) world.post_bytes(message.data(), message.size() * sizeof(float), shape, 1, round);
    if (world.rank() == 1) world.recv_bytes(0, round, [](shardwise::extents const&, auto const&) {});
    world.barrier();  // received: the next post may free this one's copy
  }
  // Without freeing, all 8 copies (2 MiB) would be held until finish_sends; MPI may lag a send or two behind.
  if (world.rank() == 0) CHECK(world.sends_in_flight() <= 2);
  world.finish_sends();
  CHECK(world.sends_in_flight() == 0);
}
