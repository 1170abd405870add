#pragma once
// `shardwise plan CONFIG.json --ranks N --memory-per-rank BYTES --sequence TOKENS [--machine FILE|calibrate]`: the
// layouts of a Llama, Qwen2, Mistral or GPT-2 model over N ranks that fit in the memory, fastest first
// (shardwise::planner).
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <shardwise/planner/calibrate.hpp>
#include <shardwise/planner/machine_file.hpp>
#include <shardwise/planner/models.hpp>
#include <string>

extern "C" void openblas_set_num_threads(int) __attribute__((weak));  // there when OpenBLAS is linked

namespace plan_command {

namespace planner = shardwise::planner;

/// What the command line gave.
struct options {
  std::string config;               ///< The config.json.
  std::size_t ranks = 0;            ///< --ranks.
  std::size_t memory_per_rank = 0;  ///< --memory-per-rank, bytes.
  std::string machine;       ///< --machine FILE, "calibrate" (measured here, kept in the cache), or empty (built in).
  std::size_t batch = 1024;  ///< --batch: sequences per step.
  std::size_t sequence = 0;  ///< --sequence: tokens per sequence (required).
  std::string precision = "bf16";  ///< --precision bf16|fp32.
  std::size_t top = 10;            ///< --top: layouts printed.
  planner::axis_choice only;       ///< --dp, --pp, --tp, --cp, --state: sizes and the sharding kept fixed.
  std::string state;               ///< --state replicated|zero1|fsdp, or empty for all.
  std::string schedule;            ///< --schedule 1f1b|zbh1|zbv for the layouts with stages, or empty (1f1b).
};

/// A check for a count given on the command line: a whole number from `least` to `most`, or a sentence that
/// says what the flag is for and the range (CLI11 prints it after the flag's name).
inline auto count_from(std::size_t least, std::size_t most, char const* meaning) {
  return [=](std::string const& text) -> std::string {
    std::size_t used = 0;
    unsigned long long value = 0;
    bool whole = !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
    try {
      if (whole) value = std::stoull(text, &used);
    } catch (std::exception const&) {
      whole = false;  // beyond 2^64
    }
    if (whole && value >= least && value <= most) return {};
    return "is " + text + "; give " + meaning + ", a whole number from " + std::to_string(least) + " to " +
           std::to_string(most);
  };
}

/// Bytes written with a unit: "80GiB", "80 GB", "8e10"; 0 when the text is not one.
inline std::size_t parse_bytes(std::string const& text) {
  std::size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (std::exception const&) {
    return 0;
  }
  std::string unit = text.substr(used);
  while (!unit.empty() && unit.front() == ' ') unit.erase(0, 1);
  double scale = 0;
  char const* const units[] = {"", "B", "KB", "MB", "GB", "TB", "KiB", "MiB", "GiB", "TiB"};
  double const scales[] = {1, 1, 1e3, 1e6, 1e9, 1e12, 0x1p10, 0x1p20, 0x1p30, 0x1p40};
  for (std::size_t i = 0; i < std::size(units); ++i)
    if (unit == units[i]) scale = scales[i];
  bool const representable = value > 0 && scale > 0 && value * scale < 1.8e19;  // below 2^64
  return representable ? static_cast<std::size_t>(value * scale) : 0;
}

inline double gib(std::size_t bytes) { return static_cast<double>(bytes) / 0x1p30; }

inline void print_layout(planner::estimate const& e) {
  auto const& l = e.plan;
  std::printf("%6zu %4zu %4zu %4zu %6zu  %-10s  %-4s  %10.2f  %11.2f  %9.2f  %10.3g  %10.4g\n", l.dp, l.pp, l.tp, l.cp,
              l.microbatches, std::string(planner::sharding_name(l.sharding)).c_str(), l.checkpointing ? "yes" : "no",
              gib(e.state_bytes), gib(e.activation_bytes + e.working_bytes), gib(e.bytes_per_rank()), e.step_seconds,
              e.tokens_per_second);
}

/// Where `--machine calibrate` keeps this CPU's calibration: $XDG_CACHE_HOME/shardwise, else ~/.cache/shardwise.
inline std::filesystem::path calibration_folder() {
  if (char const* cache = std::getenv("XDG_CACHE_HOME"); cache && *cache)
    return std::filesystem::path(cache) / "shardwise";
  if (char const* home = std::getenv("HOME"); home && *home)
    return std::filesystem::path(home) / ".cache" / "shardwise";
  return std::filesystem::current_path() / ".shardwise-cache";
}

/// This machine's calibration: the cached one, else measured now, a few seconds, as a rank runs (one BLAS thread).
inline planner::machine calibrated() {
  if (openblas_set_num_threads) openblas_set_num_threads(1);
  auto const folder = calibration_folder();
  if (!std::filesystem::exists(planner::calibration_file(folder)))
    std::fprintf(stderr, "shardwise plan: calibrating this machine (a few seconds)\n");
  return planner::calibrated_machine(folder);
}

/// Runs the search and prints it; 1 (and why, on stderr) when no layout fits.
inline int run(options const& o) {
  auto const c = planner::read_model(o.config);
  planner::training_shape shape{o.batch, o.sequence, o.precision == "fp32" ? planner::fp32 : planner::bf16_mixed};
  planner::machine const m = o.machine.empty()          ? planner::machine{}
                             : o.machine == "calibrate" ? calibrated()
                                                        : planner::read_machine(o.machine);
  planner::axis_choice only = o.only;
  for (auto s : {planner::state_sharding::replicated, planner::state_sharding::zero1, planner::state_sharding::fsdp})
    if (o.state == planner::sharding_name(s)) only.sharding = s;
  for (auto s : {planner::pipeline_choice::one_f_one_b, planner::pipeline_choice::zero_bubble_h1,
                 planner::pipeline_choice::zero_bubble_v})
    if (o.schedule == planner::schedule_name(s)) only.schedule = s;
  auto const start = std::chrono::steady_clock::now();
  auto const found = planner::search(c, shape, o.ranks, o.memory_per_rank, m, only);
  double const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  std::string extras = c.qkv_bias ? ", q/k/v biases" : "";
  if (c.sliding_window != 0) extras += ", sliding window " + std::to_string(c.sliding_window);
  if (!c.pipeline) extras += "; no pipeline stages";
  std::printf(
      "%s, %.2f B parameters (%zu layers, dim %zu, %zu heads / %zu key-value heads, hidden %zu, "
      "vocabulary %zu%s)\n",
      c.family.c_str(), static_cast<double>(planner::parameter_count(c)) / 1e9, c.layers, c.dim, c.heads, c.kv_heads,
      c.hidden, c.vocabulary, extras.c_str());
  std::printf("%zu ranks, %.1f GiB per rank; %zu sequences x %zu tokens a step, %s\n", o.ranks, gib(o.memory_per_rank),
              shape.batch, shape.sequence, std::string(shape.bytes.name).c_str());
  std::string const dated = m.measured.empty() ? "not dated" : "measured " + m.measured;
  std::string const source = o.machine.empty()          ? "built in, as tools/machines/this_machine.json"
                             : o.machine == "calibrate" ? "calibrated here, kept in " + calibration_folder().string()
                                                        : o.machine;
  std::printf("machine: %s (%s; %s)\n", m.name.c_str(), source.c_str(), dated.c_str());
  if (o.machine.empty())
    std::printf(
        "  rates drift from day to day; measure yours: cmake --build build --target bench_machine && "
        "build/bench/bench_machine > my_machine.json, then --machine my_machine.json; or --machine calibrate\n");
  if (only.schedule) std::printf("pipeline schedule: %s\n", o.schedule.c_str());
  std::printf("searched %zu layouts in %.1f ms; %zu fit\n", found.searched, ms, found.fitting.size());
  if (found.searched == 0) {
    std::fprintf(stderr,
                 "shardwise plan: no layout of %zu ranks has dp %zu, pp %zu, tp %zu, cp %zu (0: any)%s%s: dp x pp x tp "
                 "x cp must equal the ranks, tp divide the %zu heads and divide or be a multiple of the %zu key-value "
                 "heads, pp be at most the %zu layers and dp divide the --batch of %zu; cp (up to %zu, without pp, "
                 "and not with fsdp) needs a model shardwise cuts over cp (the Llama family); zero1 and fsdp need "
                 "dp x cp > 1\n",
                 o.ranks, o.only.dp, o.only.pp, o.only.tp, o.only.cp, o.state.empty() ? "" : " and state ",
                 o.state.c_str(), c.heads, c.kv_heads, c.layers, shape.batch, planner::most_context_ranks);
    return 1;
  }
  if (found.fitting.empty()) {
    auto const& s = found.smallest.plan;
    std::fprintf(
        stderr,
        "shardwise plan: no layout of %zu ranks fits in %.1f GiB per rank; the smallest needs %.1f GiB "
        "(dp %zu x pp %zu x tp %zu x cp %zu, %zu microbatches, %s, checkpointing %s): give more memory per rank, "
        "more ranks or a smaller --batch\n",
        o.ranks, gib(o.memory_per_rank), gib(found.smallest.bytes_per_rank()), s.dp, s.pp, s.tp, s.cp, s.microbatches,
        std::string(planner::sharding_name(s.sharding)).c_str(), s.checkpointing ? "on" : "off");
    return 1;
  }
  std::printf("\n%6s %4s %4s %4s %6s  %-10s  %-4s  %10s  %11s  %9s  %10s  %10s\n", "dp", "pp", "tp", "cp", "micro",
              "state", "ckpt", "model GiB", "activ. GiB", "total GiB", "step s", "tokens/s");
  for (std::size_t i = 0; i < found.fitting.size() && i < o.top; ++i) print_layout(found.fitting[i]);
  return 0;
}

}  // namespace plan_command
