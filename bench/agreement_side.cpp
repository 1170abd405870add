// One side of bench_agreement_ab: the thread mesh's all-reduce and all-gather, compiled against the headers of
// one commit with the library's namespace renamed to SIDE (shardwise_base, shardwise_head), so that two
// commits' collectives run in one process, alternately, under the same conditions.
#include <pthread.h>
#include <sched.h>

#include <Eigen/Dense>
#include <chrono>
#include <cstddef>
#include <vector>

#define shardwise SIDE
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/mesh.hpp>
#include <shardwise/mesh/thread/comm.hpp>

#define SIDE_NAME2(side, name) side##_##name
#define SIDE_NAME(side, name) SIDE_NAME2(side, name)

/// Per-call µs of `calls` all-reduces (gather false) or all-gathers of `bytes` on 2 thread ranks, timed by rank 0
/// from a barrier to the end of its last call.
double SIDE_NAME(SIDE, time_collective)(std::size_t bytes, int calls, bool gather) {
  namespace sw = shardwise;
  double per_call = 0;
  sw::run_threads(2, [&](auto& world) {
    cpu_set_t one_core;  // each rank on a core of its own: a new thread may start on its peer's core
    CPU_ZERO(&one_core);
    CPU_SET(world.rank(), &one_core);
    pthread_setaffinity_np(pthread_self(), sizeof one_core, &one_core);
    auto mesh = sw::make_mesh<"tp">(world, {world.size()});
    auto tp = mesh.template axis<"tp">();
    auto const n = static_cast<Eigen::Index>(bytes / sizeof(float));
    Eigen::VectorXf v = Eigen::VectorXf::Constant(gather ? n / 2 : n, 1e-30f), out(n);
    auto once = [&] {
      if (gather)
        sw::all_gather(tp, v, out, 0);
      else
        sw::all_reduce(tp, v);
    };
    once();
    world.barrier();
    auto const start = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) once();
    auto const stop = std::chrono::steady_clock::now();
    if (world.rank() == 0) per_call = std::chrono::duration<double, std::micro>(stop - start).count() / calls;
  });
  return per_call;
}
