// The compile-time benchmark's eight-variant file (bench/compile_time.sh, docs/build-time.md): a user's program as
// users write them. It loads a Hugging Face save_pretrained folder of a Llama model (config.json and
// model.safetensors, which it first writes itself: the program downloads nothing), and in float and in double
// under four layouts — unsharded, tensor parallel, tensor + sequence parallel, and data x tensor parallel with
// ZeRO-1 — trains a few steps, saves the model and its optimizer state sharded, reloads them into a new model and
// takes one more step with both. Run, it also checks what it compiles: every layout's losses equal the unsharded
// run's, and the reloaded model's next loss equals the saved one's, bit for bit.
//
//   bench_eight_variants [steps] [work folder]   # 2 thread ranks; SHARDWISE_THREADS=n or mpiexec for others
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

// bench/compile_time.sh --per-plan compiles this file with -DSHARDWISE_BENCH_PLANS=n (1 to 4): float only, and the
// first n of four plans — unsharded, tensor parallel, tensor + sequence parallel, tensor parallel with the
// embeddings replicated. The time from n to n + 1 is what one more plan costs a program.
#ifdef SHARDWISE_BENCH_PLANS
constexpr int plans_compiled = SHARDWISE_BENCH_PLANS;
constexpr bool per_plan_probe = true;
#else
constexpr int plans_compiled = 3;  // and data x tensor parallel, whose plan is tensor parallel's
constexpr bool per_plan_probe = false;
#endif

/// What one variant's run gave: its loss per step, and the next step's loss with the model that took the steps
/// and with the model reloaded from its checkpoint.
struct variant_run {
  std::vector<double> losses;
  double next_loss = 0, reloaded_next_loss = 0;
};

/// A batch of two sequences: the token ids and the next-token targets.
struct batch {
  std::vector<std::int64_t> ids, targets;
};

batch make_batch(models::LlamaConfig const& config) {
  batch b;
  for (std::size_t t = 0; t < 2 * config.sequence; ++t) {
    b.ids.push_back(static_cast<std::int64_t>((t * 17 + 3) % config.vocabulary));
    b.targets.push_back(static_cast<std::int64_t>((t * 17 + 20) % config.vocabulary));
  }
  return b;
}

/// One training step; returns its loss.
template <class Model, class T, class Tp, class Dp>
double train_step(Model& model, sw::AdamW<T>& optimizer, Tp const& tp, Dp const& dp, batch const& b,
                  std::size_t vocabulary) {
  auto const logits = model.forward(b.ids);  // every dp rank the same batch: the losses stay comparable
  auto const result = models::llama_loss(tp, logits, b.targets, vocabulary);
  model.backward(result.dlogits);
  optimizer.step(sw::finish_gradients(model), dp);
  sw::zero_grad(model);
  return static_cast<double>(result.loss);
}

/// Llama<T, Plan> on a dp x tp mesh of the world (ZeRO-1 when dp_size > 1): loaded from the save_pretrained folder
/// `pretrained`, trained `steps` steps, saved sharded with its optimizer state into `checkpoint`, reloaded into a
/// new model and optimizer, and one more step taken with each.
template <class T, class Plan, class World>
variant_run run_variant(World& world, fs::path const& pretrained, fs::path const& checkpoint, int steps, int dp_size) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, world.size() / dp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  auto const config = models::read_llama_config(pretrained / "config.json");
  sw::AdamWOptions<T> const options{.learning_rate = T(3e-3), .max_grad_norm = T(1), .zero1 = dp_size > 1};
  batch const b = make_batch(config);

  models::Llama<T, Plan> model(config);
  sw::parallelize(model, tp);
  sw::load_pretrained(model, tp, pretrained, sw::transformers_llama_mapping());
  sw::AdamW<T> optimizer(options);
  variant_run run;
  for (int step = 0; step < steps; ++step)
    run.losses.push_back(train_step(model, optimizer, tp, dp, b, config.vocabulary));
  sw::save_sharded(model, optimizer, tp, dp, checkpoint, steps);

  models::Llama<T, Plan> reloaded(config);
  sw::parallelize(reloaded, tp);
  sw::AdamW<T> reloaded_optimizer(options);
  sw::load_sharded(reloaded, reloaded_optimizer, tp, dp, checkpoint);
  run.next_loss = train_step(model, optimizer, tp, dp, b, config.vocabulary);
  run.reloaded_next_loss = train_step(reloaded, reloaded_optimizer, tp, dp, b, config.vocabulary);
  return run;
}

/// Writes a save_pretrained folder of a Llama model with `config` (random weights): config.json and
/// model.safetensors under transformers' names, as LlamaForCausalLM.save_pretrained writes them. Every rank calls
/// it; dp rank 0 of a 1-rank tp axis writes, through a sharded save consolidated under transformers' names.
template <class World>
void write_pretrained(World& world, models::LlamaConfig const& config, fs::path const& folder) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {world.size(), 1});
  auto const tp = sw::submesh<"tp">(mesh);
  if (mesh.coordinate(0) == 0) {
    models::Llama<float, sw::serial_plan> model(config);
    sw::parallelize(model, tp);
    sw::save_sharded(model, tp, folder / "sharded", 0);
    sw::consolidate(folder / "sharded", folder / "model.safetensors", {.mapping = sw::transformers_llama_mapping()});
    models::write_llama_config(config, folder / "config.json");
  }
  sw::barrier(mesh);
}

/// The four layouts in T, each from the folder; the largest difference of their losses from the unsharded run's,
/// and whether every reloaded model's next loss equals its saved model's.
template <class T, class World>
double worst_difference(World& world, fs::path const& work, int steps, variant_run& serial, bool& reloads_equal) {
  int const dp_size = world.size() % 2 == 0 ? 2 : 1;
  fs::path const pretrained = work / "pretrained", saved = work / (sizeof(T) == 4 ? "float" : "double");
  serial = run_variant<T, sw::serial_plan>(world, pretrained, saved / "serial", steps, 1);
  std::vector<variant_run> runs;
  if constexpr (plans_compiled >= 2)
    runs.push_back(run_variant<T, models::llama_plan<false, true>>(world, pretrained, saved / "tp", steps, 1));
  if constexpr (plans_compiled >= 3)
    runs.push_back(run_variant<T, models::llama_plan<true, true>>(world, pretrained, saved / "sp", steps, 1));
  if constexpr (!per_plan_probe)
    runs.push_back(run_variant<T, models::llama_plan<false, true>>(world, pretrained, saved / "dp", steps, dp_size));
  else if constexpr (plans_compiled >= 4)
    runs.push_back(run_variant<T, models::llama_plan<false, false>>(world, pretrained, saved / "tp_rep", steps, 1));
  double worst = 0;
  reloads_equal = serial.next_loss == serial.reloaded_next_loss;
  for (auto const& run : runs) {
    for (int s = 0; s < steps; ++s) worst = std::max(worst, std::fabs(run.losses[s] - serial.losses[s]));
    reloads_equal = reloads_equal && run.next_loss == run.reloaded_next_loss;
  }
  return worst;
}

int main(int argc, char** argv) {
  int const steps = argc > 1 ? std::atoi(argv[1]) : 3;
  if (steps < 2) {
    std::fprintf(stderr, "bench_eight_variants: needs at least 2 steps (the loss must go down), got %s\n", argv[1]);
    return 2;
  }
  fs::path const work = argc > 2 ? fs::path(argv[2]) : fs::path("eight_variants_run");
  models::LlamaConfig config;
  config.vocabulary = 64, config.dim = 32, config.layers = 2, config.heads = 4, config.kv_heads = 2;
  config.hidden = 64, config.sequence = 16;
  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/2, [&](auto& world) {
    write_pretrained(world, config, work / "pretrained");
    // Sharded sums add in another order: agreement to 1e-4 in float and 1e-10 in double.
    variant_run serial_float, serial_double;
    bool reloads_float = true, reloads_double = true;
    double const worst_float = worst_difference<float>(world, work, steps, serial_float, reloads_float);
    double worst_double = 0;
    if constexpr (per_plan_probe)
      serial_double = serial_float;
    else
      worst_double = worst_difference<double>(world, work, steps, serial_double, reloads_double);
    bool const ok = worst_float <= 1e-4 && worst_double <= 1e-10 && reloads_float && reloads_double &&
                    serial_double.losses.back() < serial_double.losses.front();
    if (world.rank() == 0) {
      std::printf(
          "eight variants on %d ranks, %d steps from a save_pretrained folder: loss %.5f -> %.5f, layouts agree to "
          "%.1e (float), %.1e (double); reloaded checkpoints take the same next step: %s  %s\n",
          world.size(), steps, serial_double.losses.front(), serial_double.losses.back(), worst_float, worst_double,
          reloads_float && reloads_double ? "yes" : "no", ok ? "ok" : "WRONG");
      if (!ok) exit_code = 1;
    }
  });
  return exit_code;
}
