// shardwise in one page: a 2-D mesh of ranks, a tensor sharded over it with the layout in its type, and the
// collectives that move it between layouts. Runs its ranks as threads by default (no launcher) and, unchanged,
// as MPI processes under mpiexec:
//
//   ./quickstart                 # 4 ranks on threads (SHARDWISE_THREADS=n for another count)
//   mpiexec -n 4 ./quickstart    # 4 MPI processes
#include <cstdio>
#include <mutex>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/shardwise.hpp>
#include <sstream>

namespace sw = shardwise;
using Matrix = Eigen::MatrixXf;

int main(int argc, char** argv) {
  bool all_correct = true;
  std::mutex print_mutex;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    // Ranks in a dp x tp grid, like torch's init_device_mesh(..., mesh_dim_names=("dp", "tp")).
    int const dp = world.size() % 2 == 0 ? 2 : 1;
    auto mesh = sw::make_mesh<"dp", "tp">(world, {dp, world.size() / dp});

    // A weight every rank can build (in a real program: loaded from a checkpoint).
    Matrix weight(6, 10);
    for (int i = 0; i < weight.size(); ++i) weight.data()[i] = float(i);

    // Replicated over dp, cut by columns over tp: the layout is part of the type.
    auto sharded = sw::distribute<sw::Layout<sw::Replicate, sw::Shard<-1>>>(mesh, weight);
    Matrix const& mine = sharded.to_local();

    // Moving to another layout: the collectives are chosen at compile time from the two layouts
    // (here an all-to-all along tp, then a slice along dp: no data crosses dp).
    auto by_rows = sw::redistribute<sw::Layout<sw::Shard<0>, sw::Shard<0>>>(sharded);
    bool const round_trip = sharded.full_tensor().isApprox(weight) && by_rows.full_tensor().isApprox(weight);

    // A partial sum (each rank's contribution) reduced over tp: an all-reduce.
    auto tp = sw::submesh<"tp">(mesh);
    Matrix contribution = Matrix::Constant(2, 2, float(tp.rank() + 1));
    auto partial = sw::from_local<sw::Layout<sw::Replicate, sw::Partial<sw::Sum>>>(mesh, contribution, {2, 2});
    float const reduced = partial.full_tensor()(0, 0);
    float const expected = float(tp.size() * (tp.size() + 1) / 2);

    // The collectives are there to use directly too, over one mesh axis.
    Matrix gathered;
    sw::all_gather(tp, mine, gathered, -1);
    bool const gather_ok = gathered.isApprox(weight);

    bool const ok = round_trip && reduced == expected && gather_ok;
    std::lock_guard lock(print_mutex);  // ranks on threads share stdout
    std::ostringstream line;
    line << "rank " << world.rank() << " (dp " << sw::coordinate<"dp">(mesh) << ", tp " << sw::coordinate<"tp">(mesh)
         << "): weight shard " << mine.rows() << "x" << mine.cols() << ", row shard " << by_rows.to_local().rows()
         << "x" << by_rows.to_local().cols() << ", tp sum " << reduced << (ok ? "  ok" : "  WRONG");
    std::puts(line.str().c_str());
    std::fflush(stdout);
    if (!ok) all_correct = false;
  });
  return all_correct ? 0 : 1;
}
