// A thread-mesh fault, chosen by argv[1]; cmake/check_mpi_fault.cmake runs it (without mpiexec) and requires a
// non-zero exit (EXIT_CODE: that one), the cause named in the output, and an end within a time limit.
//   stuck_rank: rank 1 is stuck in its own code (a busy loop that never ends) while rank 0 waits for it in an
//   all-reduce with a 0.5 s timeout; 10 s after rank 0's failure run_threads gives rank 1 up (detached) and
//   throws, main catches it and returns 3 while rank 1 still spins.
//   stuck_rank0: the same with rank 0, the calling thread, stuck (it sleeps for an hour): nothing can return
//   to main, so the process must end 10 s after rank 1's failure, with its message and exit code 1.
//   wait_notice: rank 1 sleeps for an hour while rank 0 waits under SHARDWISE_TIMEOUT and SHARDWISE_WAIT_NOTICE
//   (set by the test): notices name rank 1 until the timeout, which main catches as in stuck_rank.
#include <Eigen/Dense>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>

namespace sw = shardwise;

namespace {

std::atomic<bool> never{false};

/// A rank stuck in the program's own code: a busy loop (the harder case for ending the process) or a sleep.
void stuck(bool spin) {
  if (!spin) std::this_thread::sleep_for(std::chrono::hours(1));
  while (!never.load(std::memory_order_relaxed)) {
  }
}

/// Prints the error that reached main, and the rank's failure nested in it.
int caught(std::exception const& e) {
  std::fprintf(stderr, "caught in main: %s\n", e.what());
  try {
    std::rethrow_if_nested(e);
  } catch (std::exception const& nested) {
    std::fprintf(stderr, "nested in it: %s\n", nested.what());
  }
  return 3;
}

}  // namespace

int main(int argc, char** argv) {
  std::string const mode = argc > 1 ? argv[1] : "";
  if (mode != "stuck_rank" && mode != "stuck_rank0" && mode != "wait_notice") {
    std::fprintf(stderr, "unknown mode \"%s\"\n", mode.c_str());
    return 2;
  }
  int const stuck_rank = mode == "stuck_rank0" ? 0 : 1;
  try {
    sw::run_threads(2, [&](auto const& world) {
      auto const mesh = sw::make_mesh<"tp">(world, {2});
      if (mode != "wait_notice") mesh.set_timeout(std::chrono::milliseconds(500));
      Eigen::VectorXf v = Eigen::VectorXf::Ones(4);
      if (world.rank() == stuck_rank) stuck(mode == "stuck_rank");
      sw::all_reduce(mesh, v);
    });
  } catch (std::exception const& e) {
    return caught(e);
  }
  return 0;  // an exit code 0 fails the test: the run was to fail
}
