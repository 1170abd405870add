// The blocked causal attention (sw::nn::causal_attention) against the materialized one it replaced
// (tests/support/materialized_attention.hpp: every head's whole sequence x sequence probabilities, kept for the
// backward), forward + backward, one sequence, fp32, one thread. The Llama's attention at dim 1024: 16 query heads
// reading 8 key-value heads of 64 (TP 1), or 8 reading 4 (one rank's share at TP 2). Reports the median time, the
// rate in the causal FLOPs (forward 2 products, backward 4, each over the s^2/2 visible pairs), and the bytes each
// keeps between forward and backward and allocates while it runs. Both results are compared, so a fast wrong
// kernel fails the run.
//
// With --window W: the sliding-window attention (Mistral's) at each sequence, beside the full causal attention
// up to 8192 tokens, as time per token: the window's stays flat as the sequence grows, the full one's grows with
// it. The first W queries see every key either way, so their outputs must agree.
//
//   bench_attention [--sequence N]... [--heads 16] [--kv-heads 8] [--head-dim 64] [--block-rows 128] [--repeats 3]
//                   [--window W] [--smoke]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <shardwise/nn/kernels/functional_attention.hpp>
#include <string>
#include <vector>

#include "../tests/support/materialized_attention.hpp"
#include "median.hpp"

extern "C" void openblas_set_num_threads(int);

namespace nn = shardwise::nn;
using Matrix = nn::matrix<float>;
using Index = Eigen::Index;

namespace {

Matrix random_matrix(Index rows, Index cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Matrix m(rows, cols);
  for (Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

struct Timing {
  double forward = 0, backward = 0;
};

struct Inputs {
  Matrix q, k, v, dout;
};

template <class Forward, class Backward>
Timing time_both(int repeats, Forward&& forward, Backward&& backward) {
  std::vector<double> f, b;
  for (int i = 0; i <= repeats; ++i) {  // the first is warm-up
    auto start = std::chrono::steady_clock::now();
    forward();
    double const tf = seconds_since(start);
    start = std::chrono::steady_clock::now();
    backward();
    if (i) f.push_back(tf), b.push_back(seconds_since(start));
  }
  return {bench::median(f), bench::median(b)};
}

double max_relative_difference(Matrix const& a, Matrix const& b) {
  return double((a - b).cwiseAbs().maxCoeff() / b.cwiseAbs().maxCoeff());
}

bool run(Index s, Index heads, Index kv_heads, Index d, int repeats, std::size_t block) {
  Inputs const in{random_matrix(s, heads * d, 1), random_matrix(s, kv_heads * d, 2), random_matrix(s, kv_heads * d, 3),
                  random_matrix(s, heads * d, 4)};
  Matrix out(s, heads * d), dq(s, heads * d), dk(s, kv_heads * d), dv(s, kv_heads * d);
  nn::attention_saved<float> saved;
  Timing const blocked = time_both(
      repeats,
      [&] { nn::causal_attention<float>(in.q, in.k, in.v, std::size_t(s), std::size_t(d), out, saved, block); },
      [&] { nn::causal_attention_backward<float>(in.dout, in.q, in.k, in.v, saved, dq, dk, dv, block); });
  ref::materialized_attention<float> old;
  Matrix out_old, dq_old, dk_old, dv_old;
  Timing const materialized = time_both(
      repeats, [&] { old.forward(in.q, in.k, in.v, s, d, out_old); },
      [&] { old.backward(in.dout, in.q, in.k, in.v, dq_old, dk_old, dv_old); });
  double const difference = std::max({max_relative_difference(out, out_old), max_relative_difference(dq, dq_old),
                                      max_relative_difference(dk, dk_old), max_relative_difference(dv, dv_old)});
  double const pairs = double(s) * double(s + 1) / 2, flop = 2.0 * pairs * double(d) * double(heads);
  double const kept_old = double(heads * s * s) * 4 / (1 << 20);
  double const kept_new = double(nn::attention_saved_bytes<float>(std::size_t(s), std::size_t(heads))) / (1 << 20);
  double const panels = double(nn::attention_panel_bytes<float>(std::size_t(s), block)) / (1 << 20);
  auto row = [&](char const* name, Timing t, double kept, double transient) {
    std::printf("| %ld | %ld / %ld | %s | %.1f | %.1f | %.1f | %.1f | %.1f | %.2f | %.2f |\n", long(s), long(heads),
                long(kv_heads), name, 1e3 * t.forward, 1e3 * t.backward, 1e3 * (t.forward + t.backward),
                2 * flop / t.forward * 1e-9, 4 * flop / t.backward * 1e-9, kept, transient);
  };
  row("materialized (before)", materialized, kept_old, double(s * s) * 4 * 2 / (1 << 20));
  row("**blocked**", blocked, kept_new, panels);
  std::printf("|  |  | blocked / materialized speed | **%.2f** | **%.2f** | **%.2f** | | | | |\n",
              materialized.forward / blocked.forward, materialized.backward / blocked.backward,
              (materialized.forward + materialized.backward) / (blocked.forward + blocked.backward));
  std::fflush(stdout);
  if (difference > 1e-4) {
    std::fprintf(stderr, "bench_attention: blocked and materialized differ by %.2e at sequence %ld\n", difference,
                 long(s));
    return false;
  }
  return true;
}

/// The windowed attention's forward and backward at sequence s, and the full one's up to 8192 tokens, per token.
bool run_window(Index s, Index heads, Index kv_heads, Index d, int repeats, std::size_t block, Index window) {
  Inputs const in{random_matrix(s, heads * d, 1), random_matrix(s, kv_heads * d, 2), random_matrix(s, kv_heads * d, 3),
                  random_matrix(s, heads * d, 4)};
  Matrix out(s, heads * d), dq(s, heads * d), dk(s, kv_heads * d), dv(s, kv_heads * d);
  nn::attention_saved<float> saved;
  auto const rows = shardwise::sequence_lengths::every(std::size_t(s));
  auto const timed = [&](Index w) {
    return time_both(
        repeats,
        [&] { nn::causal_attention<float>(in.q, in.k, in.v, rows, std::size_t(d), out, saved, block, std::size_t(w)); },
        [&] { nn::causal_attention_backward<float>(in.dout, in.q, in.k, in.v, saved, dq, dk, dv, block); });
  };
  Timing const windowed = timed(window);
  Matrix const windowed_out = out;
  std::string full = "—";
  bool ok = true;
  if (s <= 8192) {
    Timing const whole = timed(0);
    char text[32];
    std::snprintf(text, sizeof text, "%.2f", 1e6 * (whole.forward + whole.backward) / double(s));
    full = text;
    Index const seen = std::min(window, s);
    ok = max_relative_difference(windowed_out.topRows(seen), out.topRows(seen)) <= 1e-5;
  }
  std::printf("| %ld | %ld | %.1f | %.1f | %.2f | %s |\n", long(s), long(window), 1e3 * windowed.forward,
              1e3 * windowed.backward, 1e6 * (windowed.forward + windowed.backward) / double(s), full.c_str());
  std::fflush(stdout);
  if (!ok) std::fprintf(stderr, "bench_attention: WRONG: windowed and full attention differ in the first window\n");
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);
  std::vector<Index> sequences;
  Index heads = 16, kv_heads = 8, d = 64;
  int repeats = 3;
  std::size_t block = nn::attention_block_rows;
  Index window = 0;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto number = [&] { return i + 1 < argc ? std::atol(argv[++i]) : 0L; };
    if (a == "--sequence")
      sequences.push_back(number());
    else if (a == "--heads")
      heads = number();
    else if (a == "--kv-heads")
      kv_heads = number();
    else if (a == "--head-dim")
      d = number();
    else if (a == "--block-rows")
      block = std::size_t(number());
    else if (a == "--repeats")
      repeats = int(number());
    else if (a == "--window")
      window = number();
    else if (a == "--smoke")
      sequences = {40}, heads = 4, kv_heads = 2, d = 8, repeats = 1;
    else {
      std::fprintf(stderr,
                   "usage: bench_attention [--sequence N]... [--heads 16] [--kv-heads 8] [--head-dim 64] "
                   "[--block-rows 128] [--repeats 3] [--window W] [--smoke]\n");
      return 2;
    }
  }
  if (window > 0) {
    if (sequences.empty()) sequences = {2048, 8192, 32768};
    std::printf(
        "| sequence | window | forward ms | backward ms | µs per token, window | µs per token, full causal |\n"
        "|---:|---:|---:|---:|---:|---:|\n");
    bool ok = true;
    for (Index s : sequences) ok = run_window(s, heads, kv_heads, d, repeats, block, window) && ok;
    return ok ? 0 : 1;
  }
  if (sequences.empty()) sequences = {256, 512, 2048, 4096};
  std::printf(
      "| sequence | heads / kv | attention | forward ms | backward ms | total ms | forward GFLOP/s | "
      "backward GFLOP/s | kept for backward MiB | transient MiB |\n|---|---|---|---:|---:|---:|---:|---:|---:|"
      "---:|\n");
  bool ok = true;
  for (Index s : sequences) ok = run(s, heads, kv_heads, d, repeats, block) && ok;
  if (ok) std::printf("all results agree (max relative difference <= 1e-4)\n");
  return ok ? 0 : 1;
}
