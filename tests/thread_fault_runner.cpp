// A thread-mesh fault that must end the process, chosen by argv[1]; cmake/check_mpi_fault.cmake runs it (without
// mpiexec) and requires a non-zero exit, the cause named in the output, and an end within a time limit.
//   stuck_rank: rank 1 is stuck in its own code (it sleeps for an hour) while rank 0 waits for it in an
//   all-reduce with a 0.5 s timeout; the process must end 10 s after rank 0's failure, with its message.
#include <Eigen/Dense>
#include <chrono>
#include <cstdio>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>

namespace sw = shardwise;

int main(int argc, char** argv) {
  std::string const mode = argc > 1 ? argv[1] : "";
  if (mode != "stuck_rank") {
    std::fprintf(stderr, "unknown mode \"%s\"\n", mode.c_str());
    return 2;
  }
  try {
    sw::run_threads(2, [](auto const& world) {
      auto const mesh = sw::make_mesh<"tp">(world, {2});
      mesh.set_timeout(std::chrono::milliseconds(500));
      Eigen::VectorXf v = Eigen::VectorXf::Ones(4);
      if (world.rank() == 1) std::this_thread::sleep_for(std::chrono::hours(1));
      sw::all_reduce(mesh, v);
    });
  } catch (std::exception const& e) {
    std::fprintf(stderr, "run_threads returned with: %s\n", e.what());  // not expected: the rank is stuck
  }
  return 0;  // an exit code 0 fails the test: the process was to end with 1
}
