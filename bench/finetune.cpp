// A fine-tuning run as a user's program does it, LoRA against full fine-tuning, on the thread mesh at tp N: load a
// save_pretrained folder (sw::Lazy + load_pretrained: each rank reads its shard), train steps of packed rows whose
// prompts' targets are masked, save (LoRA: the adapter in peft's files; full: the sharded model), and load that back
// into a fresh model. Prints the median step's tokens/s, the seconds of the load, the save and the reload, the
// optimizer's state and the process's peak resident set (VmHWM, per rank: over the ranks), and the step's floor: the
// tokens/s its weights' products alone reach on the same threads (gemm_floor_seconds). One mode per process
// (run_finetune.sh starts each), so each peak is its own; torch_finetune.py does the same with peft and torch.
//
//   bench_finetune --folder DIR --mode lora|full [--tp N] [--steps N] [--sequences N] [--out DIR] [--smoke]
// --smoke: a random model of toy sizes, written as a folder first.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <shardwise/checkpoint/peft.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "median.hpp"
#include "mfu.hpp"
#include "proc_status.hpp"

extern "C" void openblas_set_num_threads(int);

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

struct options {
  fs::path folder, out = fs::temp_directory_path() / "shardwise-bench-finetune";
  bool lora = true, smoke = false;
  int tp = 1, steps = 5, sequences = 4;
};

using Model = models::Llama<float, models::llama_plan<false>>;
sw::LoraConfig const lora_config{.rank = 16, .alpha = 32, .target_modules = {"layers.*.attention.w[qkvo]"}};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// The batch both programs train on: `sequences` rows of the config's length, each a prompt of a quarter of the
/// row (targets -100) and a response; ids from one formula (torch_finetune.py's).
void batch(models::LlamaConfig const& c, int sequences, std::vector<std::int64_t>& ids,
           std::vector<std::int64_t>& targets) {
  for (int b = 0; b < sequences; ++b)
    for (std::size_t t = 0; t < c.sequence; ++t) {
      ids.push_back(std::int64_t((std::size_t(b) * 131 + t * 17) % c.vocabulary));
      bool const prompt = t + 1 < c.sequence / 4;
      targets.push_back(prompt ? -100 : std::int64_t((std::size_t(b) * 131 + (t + 1) * 17) % c.vocabulary));
    }
}

/// The floor of a step on this machine: its products alone — each weight's forward and input gradient (and, in full
/// fine-tuning, weight gradient) with this rank's shapes at tp, every layer and the output head — timed on this
/// thread: the median of 3. The adapters' own small products, attention, norms and the loss are left out.
double gemm_floor_seconds(models::LlamaConfig const& c, int sequences, int tp, bool weight_grads) {
  using matrix = sw::nn::matrix<float>;
  auto const tokens = Eigen::Index(sequences) * Eigen::Index(c.sequence), t = Eigen::Index(tp);
  auto const d = Eigen::Index(c.dim), h = Eigen::Index(c.hidden) / t, v = Eigen::Index(c.vocabulary) / t;
  auto const q = Eigen::Index(c.heads * c.head_dim()) / t, kv = Eigen::Index(c.kv_heads * c.head_dim()) / t;
  struct shape {
    Eigen::Index in, out, times;
  };
  auto const layers = Eigen::Index(c.layers);
  std::vector<shape> const shapes{{d, q, layers},     {d, kv, 2 * layers}, {q, d, layers},
                                  {d, h, 2 * layers}, {h, d, layers},      {d, v, 1}};
  std::vector<double> runs;
  for (int repeat = 0; repeat < 3; ++repeat) {
    double seconds = 0;
    for (shape const& s : shapes) {
      matrix const x = matrix::Random(tokens, s.in), w = matrix::Random(s.out, s.in),
                   dy = matrix::Random(tokens, s.out);
      matrix y(tokens, s.out), dx(tokens, s.in), dw(s.out, s.in);
      auto const began = std::chrono::steady_clock::now();
      for (Eigen::Index k = 0; k < s.times; ++k) {
        y.noalias() = x * w.transpose();
        dx.noalias() = dy * w;
        if (weight_grads) dw.noalias() = dy.transpose() * x;
      }
      seconds += seconds_since(began);
    }
    runs.push_back(seconds);
  }
  return bench::median(runs);
}

/// The folder a --smoke run trains: a random toy Llama, saved as transformers saves one.
void write_toy_folder(fs::path const& folder) {
  models::LlamaConfig const c{
      .vocabulary = 64, .dim = 32, .layers = 1, .heads = 4, .kv_heads = 2, .hidden = 64, .sequence = 16};
  models::Llama<float> model(c);
  auto const serial = sw::make_mesh<"tp">(sw::serial_world(), {1});
  sw::save_sharded(model, serial, folder / "sharded", 0);
  sw::consolidate(folder / "sharded", folder / "model.safetensors", {.mapping = sw::transformers_llama_mapping()});
  models::write_llama_config(c, folder / "config.json");
}

/// Load, steps, save, reload on `o.tp` thread ranks; rank 0 prints the results.
void run(options const& o) {
  double const rss_before = bench::status_mib("VmRSS");
  sw::run_threads(o.tp, [&](auto& world) {
    openblas_set_num_threads(1);
    auto const tp = sw::make_mesh<"tp">(world, {world.size()});
    auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
    auto began = std::chrono::steady_clock::now();
    sw::Lazy<Model> lazy(models::read_llama_config(o.folder / "config.json"));
    sw::parallelize(lazy, tp);
    Model& model = sw::load_pretrained(lazy, tp, o.folder, sw::transformers_llama_mapping());
    if (o.lora) sw::add_lora(model, lora_config);
    double const load_seconds = seconds_since(began);
    sw::AdamW<float> optimizer({.learning_rate = 1e-4f, .weight_decay = 0.0f, .max_grad_norm = 1.0f});
    std::vector<std::int64_t> ids, targets;
    batch(model.config(), o.sequences, ids, targets);
    std::vector<double> times;
    for (int s = 0; s <= o.steps; ++s) {  // step 0 is warm-up
      sw::barrier(tp);
      began = std::chrono::steady_clock::now();
      auto const loss = models::llama_loss(tp, model.forward(ids), targets, model.config().vocabulary);
      model.backward(loss.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      sw::barrier(tp);
      if (s) times.push_back(seconds_since(began));
    }
    double const peak = bench::status_mib("VmHWM");
    began = std::chrono::steady_clock::now();
    if (o.lora)
      sw::save_lora(model, tp, o.out / "adapter", lora_config, sw::transformers_llama_name);
    else
      sw::save_sharded(model, tp, o.out / "model", o.steps);
    double const save_seconds = seconds_since(began);
    began = std::chrono::steady_clock::now();
    sw::Lazy<Model> again(models::read_llama_config(o.folder / "config.json"));
    sw::parallelize(again, tp);
    if (o.lora)
      sw::load_lora(sw::load_pretrained(again, tp, o.folder, sw::transformers_llama_mapping()), tp, o.out / "adapter",
                    sw::transformers_llama_name);
    else
      sw::load_sharded(again, tp, o.out / "model");
    double const reload_seconds = seconds_since(began);
    std::size_t const state = optimizer.state_elements();
    sw::barrier(tp);  // every rank's products at once, as in a step
    double const floor = gemm_floor_seconds(model.config(), o.sequences, o.tp, !o.lora);
    sw::barrier(tp);
    if (world.rank() != 0) return;
    double const tokens = double(o.sequences) * double(model.config().sequence);
    char const* mode = o.lora ? "lora" : "full";
    double const mfu = bench::mfu(bench::llama_training_flops(model.config(), o.sequences), bench::median(times), o.tp,
                                  bench::measure_core_peaks().fp32);  // 6 per weight, frozen ones too
    std::printf("| shardwise %s tp %d | %.0f | %.2f | %.2f | %.2f | %.1f | %.0f | %.0f | %.2f |\n", mode, o.tp,
                tokens / bench::median(times), load_seconds, save_seconds, reload_seconds,
                double(state) * 4 / (1 << 20), (peak - rss_before) / o.tp, tokens / floor, mfu);
    std::printf("RESULT shardwise_%s_tp%d %.1f %.1f %.1f\n", mode, o.tp, tokens / bench::median(times),
                (peak - rss_before) / o.tp, tokens / floor);
  });
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const flag = argv[i];
    if (flag == "--smoke") {
      o.smoke = true, o.steps = 1, o.sequences = 2;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    std::string const value = argv[++i];
    if (flag == "--folder")
      o.folder = value;
    else if (flag == "--mode")
      o.lora = value == "lora";
    else if (flag == "--tp")
      o.tp = std::stoi(value);
    else if (flag == "--steps")
      o.steps = std::stoi(value);
    else if (flag == "--sequences")
      o.sequences = std::stoi(value);
    else if (flag == "--out")
      o.out = value;
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    options o = parse(argc, argv);
    if (o.smoke) {
      o.folder = o.out / "toy";
      write_toy_folder(o.folder);
      run(o);
      o.lora = false;
      run(o);
      return 0;
    }
    if (o.folder.empty()) throw std::invalid_argument("give --folder (torch_finetune.py --write-folder writes one)");
    run(o);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "bench_finetune: %s\n", e.what());
    return 1;
  }
  return 0;
}
