// Uses shardwise through its exported targets: the core with Eigen always, and xtensor, MPI, BLAS-backed Eigen
// and checkpoints where CMakeLists.txt found those targets. Prints "consumer: ok" and exits 0 only if every
// result is right.
#include <atomic>
#include <cstdio>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
#ifdef CONSUMER_WITH_XTENSOR
#include <shardwise/adapters/xtensor.hpp>
#include <xtensor/xbuilder.hpp>
#endif
#ifdef CONSUMER_WITH_MPI
#include <shardwise/mesh/launch.hpp>
#endif
#if defined(CONSUMER_WITH_SEPARATE_RUNTIME) && !defined(SHARDWISE_SEPARATE_RUNTIME)
#error "shardwise::separate_runtime must define SHARDWISE_SEPARATE_RUNTIME"
#endif
#if defined(CONSUMER_WITH_SEPARATE_CHECKPOINT) && !defined(SHARDWISE_SEPARATE_CHECKPOINT)
#error "shardwise::separate_checkpoint must define SHARDWISE_SEPARATE_CHECKPOINT"
#endif
#ifdef CONSUMER_WITH_CHECKPOINT
#include <unistd.h>

#include <filesystem>
#include <shardwise/checkpoint/safetensors.hpp>
#include <shardwise/checkpoint/sharded_index.hpp>
#include <stdexcept>
#include <string>
#endif

namespace sw = shardwise;

namespace {
std::atomic<bool> ok{true};  // written by every rank's thread

void check(bool condition, char const* what) {
  if (!condition) {
    ok = false;
    std::printf("consumer: WRONG: %s\n", what);
  }
}
}  // namespace

int main(int argc, char** argv) {
  // shardwise::shardwise and shardwise::eigen: a matrix cut by columns over two thread ranks and put back.
  sw::run_threads(2, [](auto& world) {
    auto mesh = sw::make_mesh<"tp">(world, {2});
    Eigen::MatrixXf full(4, 6);
    for (int i = 0; i < full.size(); ++i) full.data()[i] = float(i);  // the same on every rank
    auto sharded = sw::distribute<sw::Layout<sw::Shard<-1>>>(mesh, full);
    check(sharded.to_local().cols() == 3, "Eigen: each rank holds 3 of the 6 columns");
    check(sharded.full_tensor() == full, "Eigen: the full tensor is the one distributed");
  });

#ifdef CONSUMER_WITH_XTENSOR
  // shardwise::xtensor: an all-reduce of xtensor tensors; rank r contributes r + 1 everywhere, so 1 + 2 = 3.
  sw::run_threads(2, [](auto& world) {
    auto mesh = sw::make_mesh<"tp">(world, {2});
    xt::xtensor<double, 2> t = xt::ones<double>({2, 3}) * double(world.rank() + 1);
    sw::all_reduce(sw::submesh<"tp">(mesh), t);
    check(t == xt::xtensor<double, 2>(xt::ones<double>({2, 3}) * 3.0), "xtensor: all_reduce sums to 3");
  });
#endif

#ifdef CONSUMER_WITH_EIGEN_BLAS
  // shardwise::eigen_blas: Eigen's product goes to OpenBLAS (EIGEN_USE_BLAS). 64 x 64 is past Eigen's
  // small-product path; small integers keep every sum exact in float.
  {
    Eigen::MatrixXf a(64, 64), b(64, 64);
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) a(i, j) = float((i + j) % 5), b(i, j) = float((i * j) % 3);
    Eigen::MatrixXf const c = a * b;
    bool same = true;
    for (int i = 0; i < 64; ++i)
      for (int j = 0; j < 64; ++j) {
        float sum = 0;
        for (int k = 0; k < 64; ++k) sum += float(((i + k) % 5) * ((k * j) % 3));
        same = same && c(i, j) == sum;
      }
    check(same, "eigen_blas: the BLAS product equals the sums written out");
  }
#endif

#ifdef CONSUMER_WITH_MPI
  // shardwise::mpi: launch compiles both paths (Boost.MPI linked) and, without mpiexec, runs on two threads. With
  // shardwise::separate_runtime, the float all_reduce and the mesh's split come from the target's library.
  sw::launch(argc, argv, 2, [](auto& world) {
    auto mesh = sw::make_mesh<"tp">(world, {world.size()});
    Eigen::VectorXf v = Eigen::VectorXf::Constant(5, float(world.rank() + 1));
    sw::all_reduce(sw::submesh<"tp">(mesh), v);
    float const expected = float(world.size() * (world.size() + 1) / 2);
    check(v == Eigen::VectorXf::Constant(5, expected), "mpi: launch's all_reduce sums 1..n");
  });
#else
  (void)argc, (void)argv;
#endif

#ifdef CONSUMER_WITH_CHECKPOINT
  // shardwise::checkpoint: a matrix written to a safetensors file and read back.
  {
    auto const path =
        std::filesystem::temp_directory_path() / ("shardwise_consumer_" + std::to_string(::getpid()) + ".safetensors");
    Eigen::MatrixXf w(3, 4);
    for (int i = 0; i < w.size(); ++i) w.data()[i] = float(i) / 4;
    sw::safetensors_writer out;
    out.add("w", w);
    out.write(path);
    Eigen::MatrixXf const back = sw::safetensors_file(path.string()).load<Eigen::MatrixXf>("w");
    std::filesystem::remove(path);
    check(back == w, "checkpoint: the matrix read back is the one written");
    // An entry point of checkpoint IO (from shardwise::separate_checkpoint where that is linked): its own error.
    std::string error;
    try {
      (void)sw::read_checkpoint_index(path.parent_path() / "shardwise_consumer_no_such_checkpoint");
    } catch (std::exception const& e) {
      error = e.what();
    }
    check(error.rfind("shardwise::", 0) == 0, "checkpoint: a missing checkpoint is refused with shardwise's words");
  }
#endif

  std::puts(ok ? "consumer: ok" : "consumer: WRONG");
  return ok ? 0 : 1;
}
