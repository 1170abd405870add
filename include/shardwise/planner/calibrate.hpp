#pragma once
// Measuring this machine for the planner: the rates a planner::machine holds, on the library's own GEMMs, AdamW and
// thread mesh, each the best of a few runs. `shardwise plan --machine calibrate` measures once (a few seconds) and
// keeps the result in a cache folder for the next plans on the same CPU; bench_machine measures the same, longer.
// Run it as the program runs: one BLAS thread per rank (OPENBLAS_NUM_THREADS=1).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/nn.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"
#include "shardwise/planner/machine_file.hpp"
#include "shardwise/planner/planning.hpp"
#include "shardwise/shardwise.hpp"

namespace shardwise::planner {

/// How much calibrate_machine measures: each figure the best of `runs`, the GEMM curve at `gemm_tokens`.
struct calibration {
  int runs = 5;                                        ///< Timings per figure; the fastest counts.
  std::vector<long> gemm_tokens{64, 256, 1024, 2048};  ///< Token counts of the GEMM rate curve.
};

namespace detail {
/// The fastest of `runs` timings of fn(), in seconds.
inline double fastest_seconds(int runs, std::function<void()> const& fn) {
  double best = 1e30;
  for (int r = 0; r < runs; ++r) {
    auto const start = std::chrono::steady_clock::now();
    fn();
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

/// A parameter of 16 M floats (64 MiB), for AdamW's pass over memory.
struct calibration_weight {
  Linear<float> weight{4096, 4096, 1, false};  ///< The parameter and its gradient that AdamW updates.
  SHARDWISE_CHILDREN(weight)
};
}  // namespace detail

/// FLOP/s of a Linear's forward and backward GEMMs (1024 -> 2816, fp32: y = x w^T, dx = dy w, dw = dy^T x) at
/// `tokens` tokens, the fastest of `runs`.
inline double linear_gemm_rate(long tokens, int runs) {
  using matrix = nn::matrix<float>;
  Eigen::Index const t = tokens, in = 1024, out = 2816;
  matrix const x = matrix::Random(t, in), w = matrix::Random(out, in), dy = matrix::Random(t, out);
  matrix y(t, out), dx(t, in), dw(out, in);
  double const seconds = detail::fastest_seconds(runs, [&] {
    y.noalias() = x * w.transpose();
    dx.noalias() = dy * w;
    dw.noalias() = dy.transpose() * x;
  });
  return 6.0 * double(t) * double(in) * double(out) / seconds;
}

/// machine::gemm_flops and gemm_half_rate_tokens from (tokens, rate) pairs: rate = peak t / (t + half) is
/// 1 / rate = 1 / peak + (half / peak) / t, a least-squares line in 1 / t. A curve that does not fall with fewer
/// tokens (a flat or noisy one) gives its best rate, flat (half 0).
inline std::pair<double, double> fit_gemm_curve(std::vector<std::pair<double, double>> const& tokens_and_rate) {
  double sx = 0, sy = 0, sxx = 0, sxy = 0, n = double(tokens_and_rate.size()), best = 0;
  for (auto [t, rate] : tokens_and_rate) {
    double const x = 1 / t, y = 1 / rate;
    sx += x, sy += y, sxx += x * x, sxy += x * y, best = std::max(best, rate);
  }
  double const slope = (n * sxy - sx * sy) / (n * sxx - sx * sx), intercept = (sy - slope * sx) / n;
  double const peak = 1 / intercept, half = slope / intercept;
  if (!(peak > 0) || !(half >= 0) || n < 2) return {best, 0.0};
  return {peak, half};
}

/// machine::memory_bandwidth: bytes per second of sw::AdamW's update of 16 M parameters (per parameter the weight
/// read and written, the gradient read, both moments read and written: 28 bytes), the fastest of `runs`.
inline double adamw_memory_bandwidth(int runs) {
  detail::calibration_weight model;
  model.weight.weight_grad.setConstant(1e-3f);
  AdamW<float> optimizer({.learning_rate = 1e-3f});
  auto const serial = make_mesh<"dp">(serial_world(), {1});
  optimizer.step(model, serial);  // the moments allocated and touched
  double const seconds = detail::fastest_seconds(runs, [&] { optimizer.step(model, serial); });
  return 28.0 * double(model.weight.weight.size()) / seconds;
}

/// machine::tp, dp and pp: the thread mesh's links at 2 ranks, wire bytes as transfer_seconds counts them: the
/// latency of a 4 KiB all-reduce; tp's bandwidth at the activations' size (a 1 MiB all-reduce), dp's at the
/// parameters' (a 64 MiB all-gather), pp's (a 1 MiB send and receive).
inline void measure_thread_links(machine& m, int runs) {
  run_threads(2, [&](auto& world) {
    auto const mesh = make_mesh<"x">(world, {2});
    auto const timed = [&](auto&& fn) {
      return detail::fastest_seconds(runs, [&] {
        barrier(mesh);
        fn();
        barrier(mesh);
      });
    };
    nn::vector<float> small = nn::vector<float>::Ones(1024), activations = nn::vector<float>::Ones(1 << 18);
    double const latency = timed([&] { all_reduce(mesh, small); });
    double const reduce = timed([&] { all_reduce(mesh, activations); });
    nn::vector<float> piece = nn::vector<float>::Ones(8 << 20), whole(16 << 20);
    double const gather = timed([&] { all_gather(mesh, piece, whole, 0); });
    nn::matrix<float> boundary = nn::matrix<float>::Ones(256, 1024);  // 1 MiB: rank 0 sends, rank 1 receives
    double const sent = timed([&] {
      if (world.rank() == 0) send(mesh, boundary, 1);
      if (world.rank() == 1) recv(mesh, boundary, 0);
    });
    // The transfer's own time: what was timed less one latency, but at least half of it (a noisy latency, as under
    // a sanitizer, could exceed a short transfer's time and make the rate absurd).
    auto const bandwidth = [&](double wire, double seconds) {
      return wire / std::max(seconds - latency, 0.5 * seconds);
    };
    if (world.rank() != 0) return;
    m.tp = {bandwidth(1 << 20, reduce), latency};   // an all-reduce of n bytes at 2 ranks: n on the wire
    m.dp = {bandwidth(32 << 20, gather), latency};  // (2 - 1) x 32 MiB
    m.pp = {bandwidth(1 << 20, sent), latency};
  });
}

/// This CPU's model name (/proc/cpuinfo), or "unknown CPU".
inline std::string cpu_model_name() {
  std::ifstream info("/proc/cpuinfo");
  std::string line;
  for (int lines = 0; lines < 4096 && std::getline(info, line); ++lines)
    if (line.rfind("model name", 0) == 0 && line.find(':') != std::string::npos) {
      auto name = line.substr(line.find(':') + 1);
      name.erase(0, name.find_first_not_of(' '));
      return name.substr(0, 200);
    }
  return "unknown CPU";
}

/// This machine measured: a planner::machine named after the CPU and dated now (UTC).
inline machine calibrate_machine(calibration const& how = {}) {
  machine m;
  std::vector<std::pair<double, double>> rates;
  for (long tokens : how.gemm_tokens) rates.emplace_back(double(tokens), linear_gemm_rate(tokens, how.runs));
  std::tie(m.gemm_flops, m.gemm_half_rate_tokens) = fit_gemm_curve(rates);
  m.memory_bandwidth = adamw_memory_bandwidth(how.runs);
  measure_thread_links(m, 2 * how.runs);
  m.ranks_per_node = 0;
  m.name = cpu_model_name() + ", thread mesh: calibrated by shardwise";
  char measured[32];
  std::time_t const now = std::time(nullptr);
  std::strftime(measured, sizeof measured, "%Y-%m-%d %H:%M UTC", std::gmtime(&now));
  m.measured = measured;
  return m;
}

/// A machine as the JSON text read_machine reads (tools/machines/this_machine.json's format).
inline std::string machine_json(machine const& m) {
  auto const quoted = [](std::string const& s) {
    std::string out = "\"";
    for (char c : s) {
      if (c == '"' || c == '\\') out += '\\';
      if (static_cast<unsigned char>(c) >= 0x20) out += c;
    }
    return out + "\"";
  };
  char rates[512];
  std::snprintf(
      rates, sizeof rates,
      "  \"gemm_flops\": %.6g,\n  \"gemm_half_rate_tokens\": %.6g,\n  \"memory_bandwidth\": %.6g,\n"
      "  \"ranks_per_node\": %zu,\n  \"tp\": {\"bandwidth\": %.6g, \"latency\": %.6g},\n"
      "  \"dp\": {\"bandwidth\": %.6g, \"latency\": %.6g},\n  \"pp\": {\"bandwidth\": %.6g, \"latency\": %.6g}\n",
      m.gemm_flops, m.gemm_half_rate_tokens, m.memory_bandwidth, m.ranks_per_node, m.tp.bandwidth, m.tp.latency,
      m.dp.bandwidth, m.dp.latency, m.pp.bandwidth, m.pp.latency);
  return "{\n  \"name\": " + quoted(m.name) + ",\n  \"measured\": " + quoted(m.measured) + ",\n" + rates + "}\n";
}

/// The file in `folder` that keeps this CPU's calibration (named after the CPU model).
inline std::filesystem::path calibration_file(std::filesystem::path const& folder) {
  std::string name = cpu_model_name();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return folder / ("machine_" + name + ".json");
}

/// The calibration of this CPU kept in `folder` (a file named after the CPU model): read when it is there, else
/// measured now (a few seconds) and written whole (to a temporary file, then renamed, so that a concurrent plan or
/// a crash never leaves half a file). `fresh`: measure again even when the file is there.
inline machine calibrated_machine(std::filesystem::path const& folder, calibration const& how = {},
                                  bool fresh = false) {
  auto const file = calibration_file(folder);
  if (!fresh && std::filesystem::exists(file)) return read_machine(file);
  machine const m = calibrate_machine(how);
  std::filesystem::create_directories(folder);
  auto const temporary = folder / (file.filename().string() + ".tmp" + std::to_string(std::random_device{}()));
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << machine_json(m);
    if (!out.flush()) raise("shardwise::planner::calibrated_machine: cannot write ", temporary.string());
  }
  std::filesystem::rename(temporary, file);
  return m;
}

}  // namespace shardwise::planner
