// Tensor-parallel SwiGLU MLP, forward + backward, fp32: shardwise (blocks::FeedForward with a Colwise/Rowwise
// plan) beside the same computation written by hand with Eigen and direct collective calls, at TP 1 and TP 2,
// one thread per rank (BLAS single-threaded). Prints medians and the ratios; bench/run_tp_mlp.sh adds PyTorch.
//
//   bench_tp_mlp [--tokens 2048] [--dim 1024] [--hidden 4096] [--repeats 5] [--smoke]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "../examples/blocks.hpp"

extern "C" void openblas_set_num_threads(int);  // the bench links OpenBLAS through shardwise::eigen_blas

namespace sw = shardwise;
using Matrix = sw::nn::matrix<float>;
using Clock = std::chrono::steady_clock;

using mlp_plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w3", sw::ColwiseParallel<>>,
                          sw::at<"w2", sw::RowwiseParallel<>>>;

struct Sizes {
  long tokens = 2048, dim = 1024, hidden = 4096;
  int repeats = 5;
};

Matrix random_matrix(long rows, long cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  Matrix m(rows, cols);
  for (long i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

/// The same MLP by hand: this rank's slices of the weights, Eigen products, one all-reduce forward and one
/// backward, exactly as a Megatron-style implementation would do it.
template <class Mesh>
struct HandWritten {
  Matrix w1, w3, w2, g1, g3, g2, h1, h3, a, p;
  Mesh const& tp;
  HandWritten(Mesh const& mesh, Sizes s) : tp(mesh) {
    blocks::FeedForward<float> full(static_cast<std::size_t>(s.dim), static_cast<std::size_t>(s.hidden), 1);
    long const part = s.hidden / tp.size(), start = tp.rank() * part;
    w1 = full.w1.weight.middleRows(start, part);
    w3 = full.w3.weight.middleRows(start, part);
    w2 = full.w2.weight.middleCols(start, part);
    g1.setZero(w1.rows(), w1.cols()), g3.setZero(w3.rows(), w3.cols()), g2.setZero(w2.rows(), w2.cols());
  }
  Matrix forward(Matrix const& x) {
    h1.noalias() = x * w1.transpose();
    h3.noalias() = x * w3.transpose();
    a = (h1.array() / (1.0f + (-h1.array()).exp())).matrix();
    p = a.cwiseProduct(h3);
    Matrix y(x.rows(), w2.rows());
    y.noalias() = p * w2.transpose();
    sw::all_reduce(tp, y);
    return y;
  }
  Matrix backward(Matrix const& x, Matrix const& dy) {
    g2.noalias() += dy.transpose() * p;
    Matrix dp(dy.rows(), w2.cols());
    dp.noalias() = dy * w2;
    Matrix const dh3 = dp.cwiseProduct(a);
    Matrix const sigmoid = (1.0f / (1.0f + (-h1.array()).exp())).matrix();
    Matrix const dh1 =
        (dp.cwiseProduct(h3).array() * sigmoid.array() * (1.0f + h1.array() * (1.0f - sigmoid.array()))).matrix();
    g1.noalias() += dh1.transpose() * x;
    g3.noalias() += dh3.transpose() * x;
    Matrix dx(x.rows(), x.cols());
    dx.noalias() = dh1 * w1;
    dx.noalias() += dh3 * w3;
    sw::all_reduce(tp, dx);
    return dx;
  }
};

template <class Step, class Mesh>
double median_seconds(Mesh const& tp, int repeats, Step&& step) {
  step();  // warm-up: first-touch of buffers, BLAS initialisation
  std::vector<double> times;
  for (int i = 0; i < repeats; ++i) {
    sw::barrier(tp);
    auto const start = Clock::now();
    step();
    sw::barrier(tp);
    times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

int main(int argc, char** argv) {
  Sizes s;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atol(argv[++i]) : 0L; };
    if (a == "--tokens")
      s.tokens = next();
    else if (a == "--dim")
      s.dim = next();
    else if (a == "--hidden")
      s.hidden = next();
    else if (a == "--repeats")
      s.repeats = static_cast<int>(next());
    else if (a == "--smoke")
      s = {64, 32, 128, 1};
    else {
      std::fprintf(stderr, "usage: bench_tp_mlp [--tokens N] [--dim N] [--hidden N] [--repeats N] [--smoke]\n");
      return 2;
    }
  }
  openblas_set_num_threads(1);  // one thread per rank
  Matrix const x = random_matrix(s.tokens, s.dim, 1), dy = random_matrix(s.tokens, s.dim, 2);
  double const flops = 3.0 * 3.0 * 2.0 * double(s.tokens) * double(s.dim) * double(s.hidden);  // 3 GEMMs x (1 + 2)
  std::printf("# tensor-parallel SwiGLU MLP, fp32, %ld tokens, dim %ld, hidden %ld, forward + backward, median of %d\n",
              s.tokens, s.dim, s.hidden, s.repeats);
  std::printf("| implementation | TP | ms/step | tokens/s | GFLOP/s |\n|---|---|---|---|---|\n");
  double shardwise_time[3] = {}, hand_time[3] = {};
  for (int tp_size : {1, 2}) {
    sw::run_threads(tp_size, [&](auto& world) {
      auto tp = sw::make_mesh<"tp">(world, {tp_size});
      blocks::FeedForward<float, mlp_plan> mlp(static_cast<std::size_t>(s.dim), static_cast<std::size_t>(s.hidden), 1);
      sw::parallelize(mlp, tp);
      double const t_sw = median_seconds(tp, s.repeats, [&] {
        auto const y = mlp.forward(x);
        auto const dx = sw::redistribute<sw::Replicate>(tp, mlp.backward(sw::Activation<float>{dy}));
        (void)y, (void)dx;
      });
      HandWritten hand(tp, s);
      double const t_hand = median_seconds(tp, s.repeats, [&] {
        auto const y = hand.forward(x);
        auto const dx = hand.backward(x, dy);
        (void)y, (void)dx;
      });
      if (tp.rank() == 0) shardwise_time[tp_size] = t_sw, hand_time[tp_size] = t_hand;
    });
    for (auto [name, t] : {std::pair{"shardwise", shardwise_time[tp_size]}, {"hand-written", hand_time[tp_size]}})
      std::printf("| %s | %d | %.1f | %.0f | %.1f |\n", name, tp_size, t * 1e3, double(s.tokens) / t, flops / t / 1e9);
  }
  std::printf("\nshardwise / hand-written time, TP 2: %.3f (target <= 1.02)\n", shardwise_time[2] / hand_time[2]);
  std::printf("shardwise speedup TP 2 over TP 1: %.2f (target >= 1.9)\n", shardwise_time[1] / shardwise_time[2]);
  std::printf("RESULT shardwise_tp2_tokens_per_s %.1f\n", double(s.tokens) / shardwise_time[2]);
  return 0;
}
