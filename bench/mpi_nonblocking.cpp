// Blocking MPI collectives against their non-blocking twins completed by polling (MPI_Test), the way a
// collective would have to wait to stay interruptible by a timeout: MPI_Allreduce vs MPI_Iallreduce and
// MPI_Allgather vs MPI_Iallgather, float, 4 KiB - 16 MiB, 2 ranks; best of 5 rounds, per-call µs.
// Why the MPI mesh keeps the blocking calls and bounds them with a watchdog (docs/benchmarks.md). Then how much
// of an MPI_Iallgather a rank's computing hides when it computes between the start and the wait (FSDP's
// prefetch): the fraction (gather + compute - both) / gather, with the compute about twice the gather.
//   mpiexec -n 2 --bind-to none bench_mpi_nonblocking [--smoke]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "median.hpp"

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void wait_polling(MPI_Request& request) {
  for (int done = 0; !done;) MPI_Test(&request, &done, MPI_STATUS_IGNORE);
}

/// Per-call µs of `call`, best of `rounds` rounds of `reps` calls, ranks started together.
template <class Call>
double time_per_call(int rounds, int reps, Call&& call) {
  double best = 1e300;
  for (int round = 0; round < rounds; ++round) {
    MPI_Barrier(MPI_COMM_WORLD);
    double const start = now_us();
    for (int i = 0; i < reps; ++i) call();
    best = std::min(best, (now_us() - start) / reps);
  }
  return best;
}

/// A rank's own work that touches no MPI: `passes` sweeps of a 256 KiB buffer (stays in cache).
float compute(std::vector<float>& work, int passes) {
  for (int p = 0; p < passes; ++p)
    for (auto& w : work) w = w * 0.999f + 0.001f;
  return work[0];
}

/// Per size: the blocking all-gather, the compute alone, and MPI_Iallgather + compute + polled wait, each
/// timed in every round (so drift falls on all three); medians over the rounds, and the median of the
/// per-round hidden shares.
void overlap(int me, int ranks, bool smoke) {
  if (me == 0)
    std::printf(
        "\n| size | MPI_Allgather µs | compute µs | MPI_Iallgather, compute, wait µs | share of the gather hidden "
        "|\n|---:|---:|---:|---:|---:|\n");
  std::vector<float> work(64 * 1024, 1.0f);
  double const per_pass = time_per_call(3, smoke ? 1 : 50, [&] { compute(work, 1); });
  for (std::size_t kib : {256, 1024, 4096, 16384}) {
    auto const n = static_cast<int>(kib * 1024 / sizeof(float));
    std::vector<float> data(static_cast<std::size_t>(n), 1.0f), gathered(static_cast<std::size_t>(n) * ranks);
    auto gather_once = [&] { MPI_Allgather(data.data(), n, MPI_FLOAT, gathered.data(), n, MPI_FLOAT, MPI_COMM_WORLD); };
    int const reps = smoke ? 1 : 10;
    int const passes = std::max(1, static_cast<int>(2 * time_per_call(3, reps, gather_once) / per_pass));
    std::vector<double> gathers, alones, boths, hidden;
    for (int round = 0; round < (smoke ? 1 : 21); ++round) {
      gathers.push_back(time_per_call(1, reps, gather_once));
      alones.push_back(time_per_call(1, reps, [&] { compute(work, passes); }));
      boths.push_back(time_per_call(1, reps, [&] {
        MPI_Request request;
        MPI_Iallgather(data.data(), n, MPI_FLOAT, gathered.data(), n, MPI_FLOAT, MPI_COMM_WORLD, &request);
        compute(work, passes);
        wait_polling(request);
      }));
      hidden.push_back((gathers.back() + alones.back() - boths.back()) / gathers.back());
    }
    if (me == 0)
      std::printf("| %zu KiB | %.1f | %.1f | %.1f | %.2f |\n", kib, bench::median(gathers), bench::median(alones),
                  bench::median(boths), bench::median(hidden));
  }
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  bool const smoke = argc > 1 && std::strcmp(argv[1], "--smoke") == 0;
  int me = 0, ranks = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &ranks);
  if (me == 0) {
    std::printf(
        "| size | MPI_Allreduce µs | MPI_Iallreduce + MPI_Test µs | ratio | MPI_Allgather µs | "
        "MPI_Iallgather + MPI_Test µs | ratio |\n|---:|---:|---:|---:|---:|---:|---:|\n");
  }
  for (std::size_t kib : {4, 64, 256, 1024, 4096, 16384}) {
    auto const n = static_cast<int>(kib * 1024 / sizeof(float));
    std::vector<float> data(static_cast<std::size_t>(n), 1.0f), gathered(static_cast<std::size_t>(n) * ranks);
    int const rounds = smoke ? 1 : 5, reps = smoke ? 1 : (kib <= 1024 ? 200 : 20);
    auto refill = [&] { std::fill_n(data.begin(), std::min(n, 16), 1.0f); };  // keep sums finite
    double const all_reduce = time_per_call(rounds, reps, [&] {
      MPI_Allreduce(MPI_IN_PLACE, data.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
      refill();
    });
    double const i_all_reduce = time_per_call(rounds, reps, [&] {
      MPI_Request request;
      MPI_Iallreduce(MPI_IN_PLACE, data.data(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, &request);
      wait_polling(request);
      refill();
    });
    double const all_gather = time_per_call(
        rounds, reps, [&] { MPI_Allgather(data.data(), n, MPI_FLOAT, gathered.data(), n, MPI_FLOAT, MPI_COMM_WORLD); });
    double const i_all_gather = time_per_call(rounds, reps, [&] {
      MPI_Request request;
      MPI_Iallgather(data.data(), n, MPI_FLOAT, gathered.data(), n, MPI_FLOAT, MPI_COMM_WORLD, &request);
      wait_polling(request);
    });
    if (me == 0)
      std::printf("| %zu KiB | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n", kib, all_reduce, i_all_reduce,
                  i_all_reduce / all_reduce, all_gather, i_all_gather, i_all_gather / all_gather);
  }
  overlap(me, ranks, smoke);
  MPI_Finalize();
  return 0;
}
