// Measures what `shardwise plan` predicts step times from, on this machine, and prints it as a machine file
// (tools/machines/this_machine.json's format), one BLAS thread per rank as the benchmarks run:
//  - gemm_flops and gemm_half_rate_tokens: a Linear's forward and backward GEMMs (dim 1024 -> 2816, fp32) at
//    64 to 2048 tokens, fitted to rate(tokens) = gemm_flops x tokens / (tokens + gemm_half_rate_tokens): small
//    microbatches run the GEMM kernels below their peak;
//  - memory_bandwidth: sw::AdamW's update of 16 M parameters, bytes read and written per second;
//  - each axis' link on the thread mesh at 2 ranks (wire bytes as the planner counts them): the latency of a
//    4 KiB all-reduce; tp's bandwidth at the activations' size (a 1 MiB all-reduce), dp's at the parameters' (a
//    64 MiB all-gather), pp's (a 1 MiB send and receive, as a pipeline stage's boundary);
//  - on standard error, the core's peak: fp32 fused multiply-adds and, where the CPU has avx512_bf16, bf16 dot
//    products, each a register-resident loop of independent chains (what MFU figures divide by).
// Every figure is the best of several runs: the machine's rate, not its noise.
//
//   bench_machine [--smoke]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <shardwise/nn.hpp>
#include <shardwise/shardwise.hpp>
#include <vector>

#include "core_peak.hpp"
#include "linear_gemms.hpp"

extern "C" void openblas_set_num_threads(int);

namespace {
namespace sw = shardwise;
using clock_type = std::chrono::steady_clock;
using Matrix = sw::nn::matrix<float>;

/// The fastest of `runs` timings of fn(), in seconds.
template <class Fn>
double best_seconds(int runs, Fn&& fn) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    auto const start = clock_type::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(clock_type::now() - start).count());
  }
  return best;
}

/// FLOP/s of a Linear's forward (y = x w^T) and backward (dx = dy w, dw = dy^T x) at `tokens` tokens.
double linear_rate(Eigen::Index tokens, int runs) {
  Eigen::Index const in = 1024, out = 2816;
  Matrix const x = Matrix::Random(tokens, in), w = Matrix::Random(out, in), dy = Matrix::Random(tokens, out);
  Matrix y(tokens, out), dx(tokens, in), dw(out, in);
  double const seconds = best_seconds(runs, [&] { bench::linear_gemms(x, w, dy, y, dx, dw); });
  return 6.0 * double(tokens) * double(in) * double(out) / seconds;
}

/// rate = peak t / (t + h) is 1 / rate = 1 / peak + (h / peak) / t: a least-squares line in 1 / t.
std::pair<double, double> fit_gemm(std::vector<std::pair<double, double>> const& tokens_and_rate) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0, n = double(tokens_and_rate.size());
  for (auto [t, rate] : tokens_and_rate) {
    double const x = 1 / t, y = 1 / rate;
    sx += x, sy += y, sxx += x * x, sxy += x * y;
  }
  double const slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), intercept = (sy - slope * sx) / n;
  return {1 / intercept, slope / intercept};
}

struct one_linear {
  sw::Linear<float> weight{4096, 4096, 1, false};  // 16 M parameters, 64 MiB
  SHARDWISE_CHILDREN(weight)
};

/// Bytes per second of sw::AdamW's update, the element-wise pass the planner's memory term is mostly made of:
/// per parameter, the weight read and written, the gradient read, both moments read and written (28 bytes).
double memory_bandwidth(int runs) {
  one_linear model;
  model.weight.weight_grad.setConstant(1e-3f);
  sw::AdamW<float> optimizer({.learning_rate = 1e-3f});
  auto const serial = sw::make_mesh<"dp">(sw::serial_world(), {1});
  optimizer.step(model, serial);  // the moments allocated and touched
  double const seconds = best_seconds(runs, [&] { optimizer.step(model, serial); });
  return 28.0 * double(model.weight.weight.size()) / seconds;
}

struct link_figures {
  double latency = 0, tp_bandwidth = 0, dp_bandwidth = 0, pp_bandwidth = 0;
};

/// The thread mesh's links at 2 ranks; wire bytes as planner::transfer_seconds counts them.
link_figures thread_links(int runs) {
  link_figures f;
  sw::run_threads(2, [&](auto& world) {
    auto const mesh = sw::make_mesh<"x">(world, {2});
    auto timed = [&](auto&& fn) {
      return best_seconds(runs, [&] {
        sw::barrier(mesh);
        fn();
        sw::barrier(mesh);
      });
    };
    sw::nn::vector<float> small = sw::nn::vector<float>::Ones(1024), activations = sw::nn::vector<float>::Ones(1 << 18);
    double const latency = timed([&] { sw::all_reduce(mesh, small); });
    double const reduce = timed([&] { sw::all_reduce(mesh, activations); });
    sw::nn::vector<float> piece = sw::nn::vector<float>::Ones(8 << 20), whole(16 << 20);
    double const gather = timed([&] { sw::all_gather(mesh, piece, whole, 0); });
    Matrix boundary = Matrix::Ones(256, 1024);  // 1 MiB: rank 0 sends, rank 1 receives
    double const send = timed([&] {
      if (world.rank() == 0) sw::send(mesh, boundary, 1);
      if (world.rank() == 1) sw::recv(mesh, boundary, 0);
    });
    // time = latency + wire bytes / bandwidth, as the planner adds them up; the latency is a 4 KiB call's time.
    auto const bandwidth = [&](double wire, double seconds) { return wire / std::max(seconds - latency, 1e-9); };
    if (world.rank() == 0) {
      f.latency = latency;
      f.tp_bandwidth = bandwidth(1 << 20, reduce);   // an all-reduce of n bytes at 2 ranks: n on the wire
      f.dp_bandwidth = bandwidth(32 << 20, gather);  // (2 - 1) x 32 MiB
      f.pp_bandwidth = bandwidth(1 << 20, send);
    }
  });
  return f;
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);
  bool const smoke = argc > 1 && !std::strcmp(argv[1], "--smoke");
  int const runs = smoke ? 1 : 7;
  std::vector<std::pair<double, double>> rates;
  std::fprintf(stderr, "tokens  GFLOP/s (Linear 1024 -> 2816, forward and backward)\n");
  for (Eigen::Index t : {64, 128, 256, 512, 1024, 2048}) {
    if (smoke && t > 128) break;
    rates.emplace_back(double(t), linear_rate(t, runs));
    std::fprintf(stderr, "%6ld  %.1f\n", long(t), rates.back().second / 1e9);
  }
  auto [peak, half] = fit_gemm(rates);
  if (!(peak > 0) || !(half >= 0)) {  // a flat or noisy curve: the best rate, flat
    std::fprintf(stderr, "the GEMM rates do not fall with fewer tokens; writing the best one, flat\n");
    peak = 0, half = 0;
    for (auto [t, rate] : rates) peak = std::max(peak, rate);
  }
  long const iterations = smoke ? 1000 : 20'000'000;
  bench::core_peaks const peaks = bench::measure_core_peaks(iterations, runs);
  double const fp32_peak = peaks.fp32, bf16_peak = peaks.bf16;
  std::fprintf(stderr, "peak per core: fp32 FMA %.1f GFLOP/s, bf16 dot %.1f GFLOP/s (0: no such instructions)\n",
               fp32_peak / 1e9, bf16_peak / 1e9);
  std::fprintf(
      stderr, "the Linear's best rate / the fp32 peak: %.2f\n",
      fp32_peak > 0
          ? std::max_element(rates.begin(), rates.end(), [](auto a, auto b) { return a.second < b.second; })->second /
                fp32_peak
          : 0.0);
  double const memory = memory_bandwidth(runs);
  link_figures const l = thread_links(smoke ? 1 : 20);
  char measured[32];  // UTC: shardwise plan prints it, so a stale file shows its age
  std::time_t const now = std::time(nullptr);
  std::strftime(measured, sizeof measured, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  std::printf(
      "{\n  \"name\": \"this machine, thread mesh: measured by bench_machine\",\n  \"measured\": \"%s\",\n"
      "  \"gemm_flops\": %.3g,\n"
      "  \"gemm_half_rate_tokens\": %.3g,\n  \"memory_bandwidth\": %.3g,\n  \"ranks_per_node\": 0,\n"
      "  \"tp\": {\"bandwidth\": %.3g, \"latency\": %.3g},\n  \"dp\": {\"bandwidth\": %.3g, \"latency\": %.3g},\n"
      "  \"pp\": {\"bandwidth\": %.3g, \"latency\": %.3g}\n}\n",
      measured, peak, half, memory, l.tp_bandwidth, l.latency, l.dp_bandwidth, l.latency, l.pp_bandwidth, l.latency);
  return 0;
}
