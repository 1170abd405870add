// Generation speed of sw::generate on a Llama, on the thread mesh: time to first token (the prefill of every
// prompt and the first tokens) and decode tokens/s, beside this machine's memory-bandwidth roofline measured in the
// same process: a decode step must read every weight of this rank and every cached key and value of the running
// sequences, so its time is at least (those bytes) / (the read bandwidth of as many threads as ranks, each reading
// its own buffer at once). Memory: this process's peak resident set while it generates (all its thread ranks)
// against the formula (their weights + their key-value caches). One configuration per process (run_generate.sh
// starts each), so each peak is its own. And the MFU: a decoded token's FLOPs at the decode rate over the fp32 FMA
// peak of the ranks' cores (bench/core_peak.hpp), small by nature: decoding is bound by memory.
//
// With --weights bf16, every Linear multiplies with a bf16 copy of its weight (sw::bf16_weights): the roofline's
// bytes are then the copies' and the other parameters', the memory formula counts the copies too.
//
//   bench_generate [--folder DIR] [--tp N] [--batch B] [--prompt-tokens P] [--new N] [--window W]
//                  [--weights fp32|bf16] [--smoke]
// DIR: a LlamaForCausalLM save_pretrained folder (torch_generate.py writes one); without it a random model of the
// same default sizes is built. W: a sliding window on every layer (Mistral's), whose cache keeps only the window's
// positions, and whose decode step reads only them.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <shardwise/inference.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>
#include <vector>

#include "core_peak.hpp"
#include "proc_status.hpp"

extern "C" void openblas_set_num_threads(int);

namespace {
namespace sw = shardwise;
namespace models = shardwise::models;
using clock_type = std::chrono::steady_clock;

struct settings {
  std::filesystem::path folder;
  int tp = 1, batch = 1, prompt_tokens = 128, new_tokens = 32, window = 0;
  bool smoke = false, bf16 = false;
};

/// The default model: a Llama of 672 M parameters (2.7 GB in fp32), torch_generate.py's.
models::LlamaConfig default_config() {
  return {.vocabulary = 32000,
          .dim = 2048,
          .layers = 12,
          .heads = 16,
          .kv_heads = 4,
          .hidden = 5632,
          .norm_eps = 1e-5,
          .sequence = 2048};
}

/// Reads every byte of `words` (64-bit integer sums in eight independent chains, which the compiler vectorises:
/// no dependency or floating-point rounding holds the loads back), returning their sum so that nothing is skipped.
std::uint64_t read_all(std::vector<std::uint64_t> const& words) {
  std::uint64_t sums[8] = {};
  std::size_t const n = words.size() / 8 * 8;
  for (std::size_t i = 0; i < n; i += 8)
    for (std::size_t j = 0; j < 8; ++j) sums[j] += words[i + j];
  std::uint64_t total = 0;
  for (std::uint64_t v : sums) total += v;
  return total;
}

/// Bytes per second `threads` threads read at once, each its own buffer of `bytes`: the best of 7 runs of three
/// readers (64-bit integer sums, Eigen's vectorised float sum, and a matrix-vector product over the buffer as a
/// [rows, 2048] matrix, BLAS's prefetching loads). This machine's read bandwidth: the roofline's denominator.
double read_bandwidth(int threads, std::size_t bytes) {
  auto const n = static_cast<Eigen::Index>(bytes / sizeof(float));
  std::vector<Eigen::VectorXf> buffers(static_cast<std::size_t>(threads), Eigen::VectorXf::Ones(n));
  std::vector<std::uint64_t> words(bytes / sizeof(std::uint64_t), 1);
  std::vector<double> seen(buffers.size());
  double best = 0;
  auto const reader = [&](int kind, std::size_t t) {
    Eigen::Map<Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>> m(buffers[t].data(), n / 2048,
                                                                                        2048);
    if (kind == 0) seen[t] = double(t == 0 ? read_all(words) : std::uint64_t(buffers[t].sum()));
    if (kind == 1) seen[t] = double(buffers[t].sum());
    if (kind == 2) seen[t] = double((m * Eigen::VectorXf::Ones(2048)).sum());
  };
  for (int kind = 0; kind < 3; ++kind)
    for (int run = 0; run < 7; ++run) {
      auto const began = clock_type::now();
      std::vector<std::thread> workers;
      for (std::size_t t = 0; t < buffers.size(); ++t) workers.emplace_back(reader, kind, t);
      for (auto& w : workers) w.join();
      double const seconds = std::chrono::duration<double>(clock_type::now() - began).count();
      best = std::max(best, double(threads) * double(bytes) / seconds);
      if (seen.front() <= 0) std::printf("WRONG: a read did not happen\n");
    }
  return best;
}

/// Prompts of `tokens` ids each, different per sequence.
std::vector<std::vector<std::int64_t>> make_prompts(int batch, int tokens, std::size_t vocabulary) {
  std::vector<std::vector<std::int64_t>> prompts(static_cast<std::size_t>(batch));
  for (std::size_t b = 0; b < prompts.size(); ++b)
    for (int t = 0; t < tokens; ++t)
      prompts[b].push_back(static_cast<std::int64_t>((b * 7919 + std::size_t(t) * 104729 + 17) % vocabulary));
  return prompts;
}

/// This rank's parameter bytes.
template <class Model>
double parameter_bytes(Model& model) {
  double bytes = 0;
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { bytes += double(p.value->size()) * 4; });
  return bytes;
}

/// Generates on every rank; rank 0 prints the figures against the roofline and the memory formula.
template <class Model, class Tp>
void measure(Model& model, Tp const& tp, settings const& s, double bandwidth, double core_peak) {
  auto const prompts = make_prompts(s.batch, s.prompt_tokens, model.config().vocabulary);
  sw::barrier(tp);  // every rank loaded: the peak from here on is generation's (a load maps the files)
  if (tp.rank() == 0 && !bench::reset_peak()) std::printf("# VmHWM cannot be reset here: the peak includes the load\n");
  std::optional<sw::bf16_weights<Model>> copies;  // --weights bf16
  if (s.bf16) copies.emplace(model);
  double const copy_bytes = copies ? double(copies->bytes()) : 0.0;
  sw::barrier(tp);
  (void)sw::generate(model, tp, prompts, {.max_new_tokens = 2});  // warm: first touches of the weights
  auto const g = sw::generate(model, tp, prompts, {.max_new_tokens = s.new_tokens});
  // Every rank's weights, summed; a decode step reads all of them but the token embedding's table, of which it
  // reads one row per token.
  double const table = model.config().tie_word_embeddings ? 0 : double(model.tok_embeddings.weight.size()) * 4;
  double const weights = sw::all_reduce(tp, parameter_bytes(model) - table, sw::Sum{});
  double const all_weights = sw::all_reduce(tp, parameter_bytes(model) + copy_bytes, sw::Sum{});
  // With bf16 copies, the step reads each copy instead of its fp32 weight, twice the copy's bytes.
  double const weights_read = weights - sw::all_reduce(tp, copy_bytes, sw::Sum{});
  if (tp.rank() != 0) return;
  // A decode step reads every weight once (all ranks together) and, per running sequence, its cached keys and
  // values: at the middle step, prompt + new / 2 positions (a window's at most).
  auto const shape = model.shardwise_kv_shape();
  double const positions = s.prompt_tokens + s.new_tokens / 2.0;
  double const read = s.window > 0 ? std::min(positions, double(s.window)) : positions;
  double const cached = 2.0 * double(shape.layers) * double(shape.columns) * double(tp.size()) * 4.0 * read * s.batch;
  double const steps = double(s.new_tokens - 1), step_seconds = g.decode_seconds / steps;
  double const floor_seconds = (weights_read + cached) / bandwidth;
  double const formula_mib = (all_weights + double(g.cache_bytes) * tp.size()) / (1 << 20);  // every rank's
  // MFU: a decoded token's FLOPs (2 per weight that multiplies, 2 per cached key and value it attends over) at the
  // decode rate, over the fp32 FMA peak of the ranks' cores.
  double const token_flops = 2.0 * weights / 4.0 + 2.0 * cached / 4.0 / s.batch;
  double const mfu = core_peak > 0 ? token_flops * g.decode_tokens_per_second() / (tp.size() * core_peak) : 0.0;
  std::printf(
      "tp %d batch %d window %d weights %s: cache %.1f MiB, first token %.3f s, decode %.2f tokens/s (%.1f ms a step); "
      "roofline "
      "%.1f ms a step "
      "(%.2f GB read at %.2f GB/s): %.2f of it; peak resident %.0f MiB (all ranks), their weights + caches %.0f "
      "MiB; MFU %.3f (fp32 peak %.1f GFLOP/s a core)\n",
      tp.size(), s.batch, s.window, s.bf16 ? "bf16" : "fp32", double(g.cache_bytes) * tp.size() / (1 << 20),
      g.first_token_seconds, g.decode_tokens_per_second(), 1e3 * step_seconds, 1e3 * floor_seconds,
      (weights_read + cached) / 1e9, bandwidth / 1e9, floor_seconds / step_seconds, bench::status_mib("VmHWM"),
      formula_mib, mfu, core_peak / 1e9);
  std::printf("RESULT shardwise_tp%d_batch%d%s %.4f %.3f %.4f %.0f %.0f %.0f %.0f\n", tp.size(), s.batch,
              s.bf16 ? "_bf16" : "", g.first_token_seconds, g.decode_tokens_per_second(), floor_seconds / step_seconds,
              bench::status_mib("VmHWM"), formula_mib, weights_read + cached, bandwidth);
}

settings parse(int argc, char** argv) {
  settings s;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&] { return i + 1 < argc ? std::string(argv[++i]) : std::string("0"); };
    if (a == "--folder")
      s.folder = next();
    else if (a == "--tp")
      s.tp = std::stoi(next());
    else if (a == "--batch")
      s.batch = std::stoi(next());
    else if (a == "--prompt-tokens")
      s.prompt_tokens = std::stoi(next());
    else if (a == "--new")
      s.new_tokens = std::stoi(next());
    else if (a == "--window")
      s.window = std::stoi(next());
    else if (a == "--weights") {
      std::string const w = next();
      if (w != "bf16" && w != "fp32") throw std::invalid_argument("--weights takes fp32 or bf16, not " + w);
      s.bf16 = w == "bf16";
    } else if (a == "--smoke")
      s.smoke = true;
    else
      throw std::invalid_argument("unknown argument " + a);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  settings s = parse(argc, argv);
  openblas_set_num_threads(1);  // one thread per rank
  models::LlamaConfig config =
      s.folder.empty() ? default_config() : models::read_llama_config(s.folder / "config.json");
  if (s.smoke) {
    config = {.vocabulary = 512, .dim = 128, .layers = 2, .heads = 4, .kv_heads = 2, .hidden = 352, .sequence = 256};
    s.prompt_tokens = 16, s.new_tokens = 4, s.folder.clear();
  }
  if (s.window > 0) config.sliding_window = static_cast<std::size_t>(s.window);
  double const bandwidth = read_bandwidth(s.tp, s.smoke ? (8u << 20) : (512u << 20));
  double const core_peak = bench::measure_core_peaks(s.smoke ? 1000 : 20'000'000).fp32;
  sw::run_threads(s.tp, [&](sw::ThreadComm& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {world.size()}));
    using Model = models::Llama<float, models::llama_plan<false>>;
    if (s.folder.empty()) {
      Model model(config);
      sw::parallelize(model, tp);
      measure(model, tp, s, bandwidth, core_peak);
    } else {
      sw::Lazy<Model> lazy(config);
      sw::parallelize(lazy, tp);
      measure(sw::load_pretrained(lazy, tp, s.folder, sw::transformers_llama_mapping()), tp, s, bandwidth, core_peak);
    }
  });
  return 0;
}
