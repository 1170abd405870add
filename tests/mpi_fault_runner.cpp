// One MPI fault per run, chosen by argv[1]; cmake/check_mpi_fault.cmake runs it under mpiexec and requires a
// non-zero exit, the cause named in the output, and an end within the timeout plus a few seconds.
#include <Eigen/Dense>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/mesh/mpi/comm.hpp>
#include <shardwise/shardwise.hpp>
#include <stdexcept>
#include <string>
#include <thread>

namespace sw = shardwise;

namespace {

/// Two all-reduces on a mesh over the world; `late` sleeps past the timeout between them, `leaves` returns.
void reduce_twice(sw::MpiComm const& world, bool late, bool leaves = false) {
  auto const mesh = sw::make_mesh<"tp">(world, {world.size()});
  Eigen::VectorXf v = Eigen::VectorXf::Ones(1024);
  sw::all_reduce(mesh, v);
  if (leaves) return;
  if (late) std::this_thread::sleep_for(std::chrono::seconds(8));
  sw::all_reduce(mesh, v);
}

}  // namespace

int main(int argc, char** argv) {
  std::string const mode = argc > 1 ? argv[1] : "";
  if (mode == "launch_throw") {  // the error escapes sw::launch's function; main catches it and returns 1
    try {
      sw::launch(argc, argv, 2, [](auto const& world) {
        auto const mesh = sw::make_mesh<"tp">(world, {world.size()});
        Eigen::VectorXf v = Eigen::VectorXf::Ones(16);
        if (world.rank() == 1) throw std::runtime_error("corrupt shard file on rank 1");
        sw::all_reduce(mesh, v);
      });
    } catch (std::exception const& e) {
      std::fprintf(stderr, "caught: %s\n", e.what());
      return 1;
    }
    return 0;
  }
  auto const world = sw::mpi_world(argc, argv);
  bool const faulty = world.rank() == 1;
  if (mode == "sleep" || mode == "wait_notice") {  // wait_notice: a short SHARDWISE_WAIT_NOTICE, so notices come
    reduce_twice(world, faulty);
  } else if (mode == "early_return") {
    reduce_twice(world, false, faulty);
  } else if (mode == "throw") {  // uncaught
    if (faulty) throw std::runtime_error("corrupt shard file on rank 1");
    reduce_twice(world, false);
  } else if (mode == "exit0") {
    if (faulty) std::exit(0);
    reduce_twice(world, false);
  } else if (mode == "sigkill") {
    if (faulty) std::raise(SIGKILL);
    reduce_twice(world, false);
  } else if (mode == "crossing") {
    auto const a = sw::make_mesh<"a">(world, {world.size()});
    auto const b = sw::make_mesh<"b">(world, {world.size()});
    Eigen::VectorXf v = Eigen::VectorXf::Ones(16);
    if (faulty) {
      sw::all_reduce(b, v);
      sw::all_reduce(a, v);
    } else {
      sw::all_reduce(a, v);
      sw::all_reduce(b, v);
    }
  } else if (mode == "data_stall") {  // rank 1 stops (SIGSTOP) while the data of an agreed all-reduce moves
    auto const mesh = sw::make_mesh<"tp">(world, {world.size()});
    Eigen::VectorXf v = Eigen::VectorXf::Ones(std::size_t{16} << 20);  // 64 MiB: tens of ms in MPI per call
    if (faulty) {
      std::thread([] {
        while (!sw::detail::mpi_data_watchdog::instance().armed()) std::this_thread::yield();
        std::raise(SIGSTOP);
      }).detach();
    }
    for (int i = 0; i < 1000; ++i) sw::all_reduce(mesh, v);
  } else {
    std::fprintf(stderr, "unknown mode \"%s\"\n", mode.c_str());
    return 2;
  }
  return 0;
}
