// Plain MPI, no shardwise: how long a one-integer MPI_Allreduce takes when the ranks outnumber the cores, quiet and
// beside processes that never wait (busy loops). It is the floor under every MPI test that scripts/stress.sh runs
// beside a load: OpenMPI's waiting ranks poll and call sched_yield (mpi_yield_when_idle, on when oversubscribed),
// and the scheduler then gives the busy loops nearly every cycle (bench/run_mpi_beside_load.sh, docs/test-suite.md).
//   mpiexec -n 4 --oversubscribe --bind-to none bench_mpi_beside_load [SECONDS=5] [--smoke]
// Prints the all-reduces done and the µs each took; it stops after SECONDS (rank 0's clock, agreed in the
// all-reduce itself), so a starved run ends on time instead of hanging.
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  double seconds = 5;
  char const* seconds_text = "5";
  long limit = 1000000;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--smoke") == 0) {
      limit = 100;
    } else {
      seconds_text = argv[i];
      seconds = std::atof(argv[i]);
    }
  }
  if (!(seconds > 0 && seconds <= 3600)) {
    if (rank == 0)
      std::fprintf(stderr, "bench_mpi_beside_load: SECONDS must be in (0, 3600], not '%s'\n", seconds_text);
    MPI_Finalize();
    return 2;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  auto const start = std::chrono::steady_clock::now();
  long done = 0;
  for (int stop = 0; !stop && done < limit; ++done) {
    // Every rank adds 1; rank 0 adds a large number once its time is up, and every rank reads that as "stop".
    int mine = 1;
    if (rank == 0 && std::chrono::steady_clock::now() - start > std::chrono::duration<double>(seconds)) mine += 1 << 20;
    int sum = 0;
    MPI_Allreduce(&mine, &sum, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if ((sum & ((1 << 20) - 1)) != size) {
      std::fprintf(stderr, "bench_mpi_beside_load: the all-reduce summed %d ones, not %d\n", sum & ((1 << 20) - 1),
                   size);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    stop = sum >> 20;
  }
  double const elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (rank == 0)
    std::printf("%d ranks: %ld all-reduces in %.2f s, %.1f us each\n", size, done, elapsed, 1e6 * elapsed / done);
  MPI_Finalize();
  return 0;
}
