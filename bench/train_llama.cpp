// Training throughput and per-rank memory of the Llama model at TP 1, 2, 4 and dp 2 x tp 2 (sequence
// parallel, ZeRO-1 on dp), on the thread mesh, in one run. Memory, per rank: the elements held in parameters,
// gradients and optimizer state, beside the ideal (parameters / tp; ZeRO-1 state / (tp x dp)), and, measured,
// the process's peak resident set (VmHWM). Each configuration runs in a process of its own (this program
// started again with --configuration N), so each peak is that configuration's alone.
//
//   bench_train_llama [--steps 10] [--configurations 0,1,2,3] [--vocabulary N] [--dim N] [--layers N] [--heads N]
//                     [--kv-heads N] [--hidden N] [--sequence N] [--sequences N] [--compute fp32|bf16] [--smoke]
// Without a configuration list all four run. Ratios "vs TP 1" need configuration 0 (TP 1) in the list. With
// --compute bf16 the steps run under sw::bf16_autocast (bf16 products, through oneDNN where the build has it; the
// GEMMs alone then are oneDNN's bf16 products of bf16 operands, or fp32's without oneDNN).
//
// Beside tokens/s, the machine's share: model FLOP/s (6 x tokens x the weights that multiply, plus the causal
// attention's products, recomputation not counted) against the rate of the same step's GEMMs alone, run right
// after each of a second set of steps on the same threads (each its rank's shapes, all at once): the median of
// the step-by-step ratios; and the MFU: model FLOP/s over the fp32 FMA peak of the cores the ranks run on
// (bench/core_peak.hpp, measured in the same run), and with --compute bf16 over their bf16 peak too (AMX's tiles
// where the CPU has them, else its bf16 dot products), beside the GEMMs alone over the same peak.
#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "linear_gemms.hpp"
#include "median.hpp"
#include "mfu.hpp"
#include "proc_status.hpp"

extern "C" void openblas_set_num_threads(int);

namespace sw = shardwise;
namespace models = shardwise::models;

/// One step's GEMMs alone, forward and backward, with one rank's shapes at TP `tp` and its dp group's tokens (all
/// of them: sequence parallelism gathers them before each column-parallel GEMM). One layer's matrices serve every
/// layer, as the model's layers have the same shapes. The attention's own products are not among them.
class StepGemms {
 public:
  StepGemms(models::LlamaConfig const& c, int sequences, int tp, [[maybe_unused]] bool bf16) {
    auto const tokens = Eigen::Index(sequences) * Eigen::Index(c.sequence), t = Eigen::Index(tp);
    auto const d = Eigen::Index(c.dim), h = Eigen::Index(c.hidden), q = Eigen::Index(c.heads * c.head_dim());
    // Each key-value head repeated where tp exceeds them (as the model does), the vocabulary padded to tp.
    auto const copies = models::kv_size_multiplier(c.heads, c.kv_heads, std::size_t(tp), c.kv_size_multiplier);
    auto const kv = Eigen::Index(c.kv_heads * std::max<std::size_t>(copies, 1) * c.head_dim());
    auto const vocabulary = (Eigen::Index(c.vocabulary) + t - 1) / t * t;
    // (in, out, times per step) of each weight a rank multiplies: wq, wk, wv, wo, w1, w3, w2, the output head.
    shapes_ = {{d, q / t, c.layers}, {d, kv / t, c.layers}, {d, kv / t, c.layers}, {q / t, d, c.layers},
               {d, h / t, c.layers}, {d, h / t, c.layers},  {h / t, d, c.layers},  {d, vocabulary / t, 1}};
    for (auto s : shapes_) {
      flops_ += 6.0 * double(tokens) * double(s.in) * double(s.out) * double(s.times);
      x_.push_back(Matrix::Random(tokens, s.in)), w_.push_back(Matrix::Random(s.out, s.in));
      dy_.push_back(Matrix::Random(tokens, s.out)), y_.emplace_back(tokens, s.out), dx_.emplace_back(tokens, s.in);
      dw_.emplace_back(s.out, s.in);
#if defined(SHARDWISE_WITH_ONEDNN)
      if (bf16) bf16_.emplace_back(long(tokens), long(s.in), long(s.out));
#endif
    }
  }
  /// The FLOPs of one run on this rank.
  [[nodiscard]] double flops() const { return flops_; }
  /// Runs them once.
  void run() {
    for (std::size_t k = 0; k < shapes_.size(); ++k)
      for (std::size_t time = 0; time < shapes_[k].times; ++time)
#if defined(SHARDWISE_WITH_ONEDNN)
        if (!bf16_.empty())
          bf16_[k].run();
        else
#endif
          bench::linear_gemms(x_[k], w_[k], dy_[k], y_[k], dx_[k], dw_[k]);
  }

 private:
  using Matrix = sw::nn::matrix<float>;
  struct Shape {
    Eigen::Index in, out;
    std::size_t times;
  };
  std::vector<Shape> shapes_;
  double flops_ = 0;
  std::vector<Matrix> x_, w_, dy_, y_, dx_, dw_;
#if defined(SHARDWISE_WITH_ONEDNN)
  std::vector<bench::onednn_bf16_linear_gemms> bf16_;  // with --compute bf16: oneDNN's products of bf16 operands
#endif
};

struct Result {
  double tokens_per_second = 0;
  std::size_t parameters = 0, gradients = 0, state = 0;
  double rss_before_mib = 0, peak_rss_mib = 0;  // this process, before the model is built and at its peak
  double gemm_ceiling = 0;  // FLOP/s of the step's GEMMs alone on the same threads, right after each step: median
  double share = 0;         // median over the steps of (model FLOP/s) / (the GEMMs' FLOP/s right after that step)
};

/// --compute bf16: the steps under sw::bf16_autocast.
bool bf16_compute = false;

/// Steps of training: a warm-up, then `steps` timed, their median giving tokens/s and the process's peak RSS
/// read after them; then `steps` more, each followed by the step's GEMMs alone on the same threads, which give
/// the machine's share step by step (the machine's speed drifts within seconds here: pairs, not one ceiling
/// measured later). The GEMMs' matrices are made after the peak is read, so it is the training's alone.
template <class Plan>
Result measure(int ranks, int dp_size, int steps, models::LlamaConfig const& c, int sequences, bool zero1) {
  Result result;
  result.rss_before_mib = bench::status_mib("VmRSS");
  sw::run_threads(ranks, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, ranks / dp_size});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    models::Llama<float, Plan> model(c);
    sw::AdamW<float> optimizer({.learning_rate = 1e-3f, .max_grad_norm = 1.0f, .zero1 = zero1});
    sw::parallelize(model, tp);
    std::optional<sw::bf16_autocast<models::Llama<float, Plan>>> autocast;
    if (bf16_compute) autocast.emplace(model);
    int const mine = sequences / dp_size;
    std::vector<std::int64_t> ids, targets;
    for (int b = 0; b < mine; ++b)
      for (std::size_t t = 0; t < c.sequence; ++t) {
        ids.push_back(static_cast<std::int64_t>((b * 131 + t * 17 + dp.rank() * 7) % c.vocabulary));
        targets.push_back(static_cast<std::int64_t>((b * 131 + t * 17 + 1) % c.vocabulary));
      }
    auto const timed = [&](auto&& work) {
      sw::barrier(mesh);
      auto const start = std::chrono::steady_clock::now();
      work();
      sw::barrier(mesh);
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    auto const step = [&] {
      auto const loss = models::llama_loss(tp, model.forward(ids), targets, c.vocabulary);
      model.backward(loss.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
    };
    std::vector<double> times;
    for (int s = 0; s <= steps; ++s) {  // step 0 is warm-up
      double const seconds = timed(step);
      if (s) times.push_back(seconds);
    }
    sw::barrier(mesh);
    if (world.rank() == 0) result.peak_rss_mib = bench::status_mib("VmHWM");
    sw::barrier(mesh);  // no rank allocates the GEMMs' matrices before the peak is read
    StepGemms gemms(c, mine, tp.size(), bf16_compute);
    timed([&] { gemms.run(); });  // warm-up
    std::vector<double> ceilings, shares;
    for (int s = 0; s < steps; ++s) {
      double const step_seconds = timed(step), gemm_seconds = timed([&] { gemms.run(); });
      double const ceiling = gemms.flops() * ranks / gemm_seconds;
      ceilings.push_back(ceiling);
      shares.push_back(bench::llama_training_flops(c, sequences) / step_seconds / ceiling);
    }
    if (world.rank() == 0) {
      result.tokens_per_second = double(sequences) * double(c.sequence) / bench::median(times);
      result.gemm_ceiling = bench::median(ceilings), result.share = bench::median(shares);
      sw::for_each_parameter(model, [&](std::string const&, auto const& p) {
        result.parameters += static_cast<std::size_t>(p.value->size());
        result.gradients += static_cast<std::size_t>(p.grad->size());
      });
      result.state = optimizer.state_elements();
    }
  });
  return result;
}

struct Configuration {
  char const* name;
  int ranks, dp, tp;
};
constexpr std::array<Configuration, 4> configurations{{
    {"TP 1", 1, 1, 1},
    {"TP 2 (sequence parallel)", 2, 1, 2},
    {"TP 4 (sequence parallel, 4 threads on 2 cores)", 4, 1, 4},
    {"dp 2 x tp 2, ZeRO-1 (4 threads on 2 cores)", 4, 2, 2},
}};

Result run_configuration(int which, int steps, models::LlamaConfig const& c, int sequences) {
  auto const& k = configurations[std::size_t(which)];
  Result r = k.tp == 1 ? measure<models::llama_plan<false>>(k.ranks, k.dp, steps, c, sequences, false)
                       : measure<models::llama_plan<true>>(k.ranks, k.dp, steps, c, sequences, k.dp > 1);
  return r;
}

// Runs one configuration in a fresh process: this program again, with --configuration, read back from a pipe.
Result in_own_process(char const* self, int which, std::string const& options) {
  std::string const command = std::string("'") + self + "' --configuration " + std::to_string(which) + options;
  FILE* pipe = popen(command.c_str(), "r");
  Result r;
  int got = 0;
  if (pipe) {
    got = std::fscanf(pipe, "RESULT %lf %zu %zu %zu %lf %lf %lf %lf", &r.tokens_per_second, &r.parameters, &r.gradients,
                      &r.state, &r.rss_before_mib, &r.peak_rss_mib, &r.gemm_ceiling, &r.share);
    int const status = pclose(pipe);
    if (status != 0) got = 0;
  }
  if (got != 8) {
    std::fprintf(stderr, "bench_train_llama: configuration %d failed (%s)\n", which, command.c_str());
    std::exit(1);
  }
  return r;
}

int main(int argc, char** argv) {
  int steps = 10, configuration = -1;
  bool smoke = false;
  models::LlamaConfig c;
  c.vocabulary = 2048, c.dim = 256, c.layers = 4, c.heads = 8, c.kv_heads = 4, c.hidden = 704, c.sequence = 128;
  int sequences = 8;
  std::vector<int> chosen;  // --configurations: the ones to run, all by default
  std::string shape;        // the model and batch flags, passed on to each configuration's process
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    bool const has_value = i + 1 < argc;
    if (a == "--steps" && has_value)
      steps = std::atoi(argv[++i]);
    else if (a == "--configuration" && has_value)
      configuration = std::atoi(argv[++i]);
    else if (a == "--configurations" && has_value)
      for (std::stringstream list(argv[++i]); list.good();) {
        std::string item;
        std::getline(list, item, ',');
        chosen.push_back(std::atoi(item.c_str()));
      }
    else if (std::size_t* field = a == "--vocabulary" ? &c.vocabulary
                                  : a == "--dim"      ? &c.dim
                                  : a == "--layers"   ? &c.layers
                                  : a == "--heads"    ? &c.heads
                                  : a == "--kv-heads" ? &c.kv_heads
                                  : a == "--hidden"   ? &c.hidden
                                  : a == "--sequence" ? &c.sequence
                                                      : nullptr;
             field && has_value)
      *field = std::size_t(std::atol(argv[++i])), shape += " " + a + " " + argv[i];
    else if (a == "--sequences" && has_value)
      sequences = std::atoi(argv[++i]), shape += " " + a + " " + argv[i];
    else if (a == "--compute" && has_value) {
      std::string const how = argv[++i];
      if (how != "fp32" && how != "bf16") {
        std::fprintf(stderr, "bench_train_llama: --compute takes fp32 or bf16, not %s\n", how.c_str());
        return 2;
      }
      bf16_compute = how == "bf16", shape += " --compute " + how;
    } else if (a == "--smoke")
      smoke = true, steps = 1, c.vocabulary = 64, c.dim = 32, c.layers = 1, c.hidden = 64, c.sequence = 8,
      sequences = 4;
    else {
      std::fprintf(stderr,
                   "usage: bench_train_llama [--steps N] [--configurations 0,1,...] [--vocabulary N] [--dim N] "
                   "[--layers N] [--heads N] [--kv-heads N] [--hidden N] [--sequence N] [--sequences N] [--smoke]\n");
      return 2;
    }
  }
  if (steps < 1 || configuration >= int(configurations.size())) {
    std::fprintf(stderr, "bench_train_llama: --steps must be >= 1, --configuration 0..%zu\n",
                 configurations.size() - 1);
    return 2;
  }
  openblas_set_num_threads(1);
  if (configuration >= 0) {  // the child: one configuration, one line back to the parent
    auto const r = run_configuration(configuration, steps, c, sequences);
    std::printf("RESULT %.3f %zu %zu %zu %.3f %.3f %.6g %.6g\n", r.tokens_per_second, r.parameters, r.gradients,
                r.state, r.rss_before_mib, r.peak_rss_mib, r.gemm_ceiling, r.share);
    return 0;
  }
  std::string const options = " --steps " + std::to_string(steps) + (smoke ? " --smoke" : "") + shape;
  if (chosen.empty())
    for (int k = 0; k < int(configurations.size()); ++k) chosen.push_back(k);
  std::error_code no_proc;  // this program's own path, whatever the caller's working directory and PATH
  auto const self = std::filesystem::read_symlink("/proc/self/exe", no_proc);
  std::string const program = no_proc ? std::string(argv[0]) : self.string();
  std::vector<Result> results(configurations.size());
  for (int k : chosen) {
    if (k < 0 || k >= int(configurations.size())) {
      std::fprintf(stderr, "bench_train_llama: --configurations takes numbers 0..%zu\n", configurations.size() - 1);
      return 2;
    }
    results[std::size_t(k)] = in_own_process(program.c_str(), k, options);
  }

  std::printf(
      "# Llama training, %s, vocabulary %zu, dim %zu, %zu layers, %zu heads (%zu kv), hidden %zu, %d x %zu "
      "tokens per step, median of %d steps, thread mesh on %d cores, each configuration in its own process\n",
      bf16_compute ? "bf16 products (sw::bf16_autocast)" : "fp32", c.vocabulary, c.dim, c.layers, c.heads, c.kv_heads,
      c.hidden, sequences, c.sequence, steps, 2);
  auto const& serial = results[0];
  std::printf(
      "| mesh | tokens/s | vs TP 1 | parameters / rank | ideal | gradients / rank | optimizer state / rank | "
      "ideal |\n|---|---|---|---|---|---|---|---|\n");
  for (int chosen_k : chosen) {
    auto const k = std::size_t(chosen_k);
    auto const& r = results[k];
    auto const tp = std::size_t(configurations[k].tp), dp = std::size_t(configurations[k].dp);
    std::printf("| %s | %.0f | %.2f | %zu | %zu | %zu | %zu | %zu |\n", configurations[k].name, r.tokens_per_second,
                r.tokens_per_second / serial.tokens_per_second, r.parameters, serial.parameters / tp, r.gradients,
                r.state, 2 * serial.parameters / (tp * dp));
  }
  // Memory in MiB: what the counts hold in fp32 (ideal: parameters / tp, gradients / tp, AdamW's two moments
  // / (tp x dp) under ZeRO-1), and the process's measured peak resident set. The thread mesh runs all ranks in
  // one process, so the peak covers them all: the growth over the resident set before the model (the program
  // and its libraries) divided by the ranks is the measured share per rank, activations and buffers included.
  double const mib = 1024.0 * 1024.0, bytes = sizeof(float);
  std::printf(
      "\n| mesh | ranks | parameters + gradients + optimizer state MiB / rank | ideal | process peak RSS MiB | "
      "RSS before the model MiB | (peak - before) / ranks MiB |\n|---|---|---|---|---|---|---|\n");
  for (int chosen_k : chosen) {
    auto const k = std::size_t(chosen_k);
    auto const& r = results[k];
    auto const& conf = configurations[k];
    double const held = double(r.parameters + r.gradients + r.state) * bytes / mib;
    double const ideal =
        (2.0 * double(serial.parameters) / conf.tp + 2.0 * double(serial.parameters) / (conf.tp * conf.dp)) * bytes /
        mib;
    std::printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f |\n", conf.name, conf.ranks, held, ideal, r.peak_rss_mib,
                r.rss_before_mib, (r.peak_rss_mib - r.rss_before_mib) / conf.ranks);
  }
  // The machine's share: the model's FLOP/s against its own GEMMs' rate on the same threads, and against the cores'
  // fp32 FMA peak (MFU: the ranks' cores, at most the machine's).
  bench::core_peaks const peaks = bench::measure_core_peaks(smoke ? 1000 : 20'000'000);
  std::printf("\ncore peak: fp32 FMA %.1f, bf16 dot %.1f, bf16 AMX tiles %.1f GFLOP/s per core (0: not here)\n",
              peaks.fp32 / 1e9, peaks.bf16 / 1e9, peaks.bf16_amx / 1e9);
  std::printf(
      "\n| mesh | model GFLOP / step | model GFLOP/s (the timed steps) | the step's GEMMs alone (%s), same threads, "
      "GFLOP/s (median of the pairs) | model / GEMMs alone (median of step-by-step pairs) | MFU (model / the cores' "
      "fp32 peak) |%s\n|---|---|---|---|---|---|%s\n",
      bf16_compute ? "bf16" : "fp32",
      bf16_compute ? " MFU bf16 (model / the cores' bf16 peak) | GEMMs alone / bf16 peak |" : "",
      bf16_compute ? "---|---|" : "");
  double const step_flops = bench::llama_training_flops(c, sequences);
  for (int chosen_k : chosen) {
    auto const& conf = configurations[std::size_t(chosen_k)];
    double const achieved =
        step_flops * results[std::size_t(chosen_k)].tokens_per_second / (double(sequences) * double(c.sequence));
    auto const& r = results[std::size_t(chosen_k)];
    std::printf("| %s | %.1f | %.1f | %.1f | %.2f | %.2f |", conf.name, step_flops / 1e9, achieved / 1e9,
                r.gemm_ceiling / 1e9, r.share, bench::mfu(achieved, 1.0, conf.ranks, peaks.fp32));
    if (bf16_compute)
      std::printf(" %.3f | %.3f |", bench::mfu(achieved, 1.0, conf.ranks, peaks.bf16_best()),
                  bench::mfu(r.gemm_ceiling, 1.0, conf.ranks, peaks.bf16_best()));
    std::printf("\n");
  }
  std::printf("RESULT shardwise_tp1 %.1f\n", results[0].tokens_per_second);
  std::printf("RESULT shardwise_tp2 %.1f\n", results[1].tokens_per_second);
  return 0;
}
