// A tensor-parallel attention block: q, k and v ColwiseParallel (each rank computes whole heads, heads / tp
// of them), the output projection RowwiseParallel. The same block built with sw::serial_plan gives the
// reference. Threads by default; unchanged under mpiexec.
#include <cstdio>
#include <mutex>
#include <random>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/shardwise.hpp>

#include "blocks.hpp"

namespace sw = shardwise;
using Matrix = sw::nn::matrix<float>;

using attention_plan = sw::plan<sw::at<"wq", sw::ColwiseParallel<>>, sw::at<"wk", sw::ColwiseParallel<>>,
                                sw::at<"wv", sw::ColwiseParallel<>>, sw::at<"wo", sw::RowwiseParallel<>>>;

int main(int argc, char** argv) {
  constexpr std::size_t tokens = 32, sequence = 16, dim = 64, heads = 8;  // two sequences of 16 tokens
  Matrix x(tokens, dim), dy(tokens, dim);
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng), dy.data()[i] = normal(rng);

  bool all_ok = true;
  std::mutex print;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    auto tp = sw::make_mesh<"tp">(world, {world.size()});
    blocks::Attention<float, attention_plan> attention(dim, heads, sequence, /*seed=*/3);
    sw::parallelize(attention, tp);  // refuses a head count the tp size does not divide
    auto const y = attention.forward(x);
    // Partial<Sum> under ColwiseParallel (wq's, wk's and wv's parts): one all-reduce makes it whole.
    auto const dx = sw::redistribute<sw::Replicate>(tp, attention.backward(sw::Activation<float>{dy}));

    blocks::Attention<float> reference(dim, heads, sequence, 3);
    auto const y_ref = reference.forward(x);
    auto const dx_ref = reference.backward(sw::Activation<float>{dy});
    float const y_error = (y.local - y_ref.local).cwiseAbs().maxCoeff() / y_ref.local.cwiseAbs().maxCoeff();
    float const dx_error = (dx.local - dx_ref.local).cwiseAbs().maxCoeff() / dx_ref.local.cwiseAbs().maxCoeff();
    bool const ok = y_error <= 1e-5f && dx_error <= 1e-5f;

    std::lock_guard lock(print);
    std::printf("rank %d of %d: %ld of %zu heads; vs unsharded: output %.1e, input grad %.1e  %s\n", tp.rank(),
                tp.size(), long(attention.wq.weight.rows()) / long(dim / heads), heads, y_error, dx_error,
                ok ? "ok" : "WRONG");
    std::fflush(stdout);
    if (!ok) all_ok = false;
  });
  return all_ok ? 0 : 1;
}
