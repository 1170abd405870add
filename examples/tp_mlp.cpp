// A tensor-parallel SwiGLU MLP (w1, w3 ColwiseParallel, w2 RowwiseParallel, as Megatron and torchtitan cut
// it): each rank holds a quarter of the hidden features, and the forward pass needs one all-reduce, in w2.
// The same block built with sw::serial_plan gives the reference. Threads by default; unchanged under mpiexec.
#include <cstdio>
#include <mutex>
#include <random>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/shardwise.hpp>

#include "blocks.hpp"

namespace sw = shardwise;
using Matrix = sw::nn::matrix<float>;

using mlp_plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>,  // hidden features split: no communication
                          sw::at<"w3", sw::ColwiseParallel<>>,
                          sw::at<"w2", sw::RowwiseParallel<>>>;  // partial sums all-reduced to Replicate

int main(int argc, char** argv) {
  constexpr std::size_t tokens = 64, dim = 128, hidden = 512;
  Matrix x(tokens, dim), dy(tokens, dim);
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng), dy.data()[i] = normal(rng);

  bool all_ok = true;
  std::mutex print;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    auto tp = sw::make_mesh<"tp">(world, {world.size()});
    blocks::FeedForward<float, mlp_plan> mlp(dim, hidden, /*seed=*/1);  // same seed: same weights as unsharded
    sw::parallelize(mlp, tp);
    auto const y = mlp.forward(x);
    // Partial<Sum> under ColwiseParallel (w1's and w3's parts): one all-reduce makes it whole.
    auto const dx = sw::redistribute<sw::Replicate>(tp, mlp.backward(sw::Activation<float>{dy}));

    blocks::FeedForward<float> reference(dim, hidden, 1);
    auto const y_ref = reference.forward(x);
    auto const dx_ref = reference.backward(sw::Activation<float>{dy});
    float const y_error = (y.local - y_ref.local).cwiseAbs().maxCoeff() / y_ref.local.cwiseAbs().maxCoeff();
    float const dx_error = (dx.local - dx_ref.local).cwiseAbs().maxCoeff() / dx_ref.local.cwiseAbs().maxCoeff();
    bool const ok = y_error <= 1e-5f && dx_error <= 1e-5f;

    std::lock_guard lock(print);
    std::printf("rank %d of %d: w1 shard %ldx%ld, w2 shard %ldx%ld; vs unsharded: output %.1e, input grad %.1e  %s\n",
                tp.rank(), tp.size(), long(mlp.w1.weight.rows()), long(mlp.w1.weight.cols()),
                long(mlp.w2.weight.rows()), long(mlp.w2.weight.cols()), y_error, dx_error, ok ? "ok" : "WRONG");
    std::fflush(stdout);
    if (!ok) all_ok = false;
  });
  return all_ok ? 0 : 1;
}
