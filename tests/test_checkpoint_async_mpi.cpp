// Asynchronous sharded saves on the MPI mesh (run by CTest under mpiexec at 2 and 4 processes, TP = world size):
// a round trip bit for bit, a training step while every process's background write is held in flight, and one
// process's failed background write raised on every process with its words, at wait() and at the next save.
// The background threads make no MPI call: every collective runs on the processes' main threads.
#include <doctest/doctest.h>

#include <filesystem>
#include <shardwise/checkpoint/async_save.hpp>
#include <string>

#include "cases/async_save_cases.hpp"
#include "support/worlds.hpp"

namespace sw = shardwise;
namespace fs = std::filesystem;

namespace {

/// A folder all processes name alike (one per world size, so runs at 2 and 4 processes do not meet), fresh.
template <class World>
fs::path shared_dir(World const& world, std::string const& name) {
  fs::path const dir = fs::current_path() / ("checkpoint_async_mpi_" + std::to_string(world.size())) / name;
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
  }
  world.barrier();
  return dir;
}

template <class World>
void remove_shared(World const& world) {
  world.barrier();
  if (world.rank() == 0) fs::remove_all(fs::current_path() / ("checkpoint_async_mpi_" + std::to_string(world.size())));
}

}  // namespace

TEST_CASE("MPI: async save round trips bit for bit at TP = world size; committed by wait() and by poll()") {
  auto const world = worlds::mpi();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, world.size()});
  async_cases::round_trip(mesh, shared_dir(world, "round_trip") / "ckpt");
  remove_shared(world);
}

TEST_CASE("MPI: a training step runs while every process's write is in flight; the checkpoint is the call's") {
  auto const world = worlds::mpi();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, world.size()});
  fs::path const ckpt = shared_dir(world, "overlap") / "ckpt";
  async_cases::gated const gate(ckpt);
  async_cases::overlaps_a_training_step(mesh, ckpt);
  remove_shared(world);
}

TEST_CASE("MPI: one process's failed background write is raised on every process with its words") {
  auto const world = worlds::mpi();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, world.size()});
  for (bool at_next_save : {false, true}) {
    CAPTURE(at_next_save);
    fs::path const ckpt = shared_dir(world, at_next_save ? "failure_next" : "failure_wait") / "ckpt";
    async_cases::gated const gate(ckpt, world.size() - 1);
    async_cases::failure_is_raised_on_every_rank(mesh, ckpt, world.size() - 1, at_next_save);
  }
  remove_shared(world);
}
