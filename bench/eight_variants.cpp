// The compile-time benchmark's eight-variant file (bench/compile_time.sh, docs/build-time.md; issue 34): a user's
// program that trains the Llama model in float and in double under four layouts — unsharded, tensor parallel,
// tensor + sequence parallel, and data x tensor parallel with ZeRO-1 — on whatever world sw::launch gives it.
// Run, it also checks what it compiles: every layout's losses over a few steps equal the unsharded run's.
//
//   bench_eight_variants [steps]        # 2 thread ranks; SHARDWISE_THREADS=n or mpiexec for others
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

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

/// The losses of `steps` steps of the Llama model in T under Plan on a dp x tp mesh of the world (dp ranks:
/// `dp_size`, ZeRO-1 when more than one).
template <class T, class Plan, class World>
std::vector<double> losses(World& world, models::LlamaConfig const& config, int steps, int dp_size) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, world.size() / dp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  models::Llama<T, Plan> model(config);
  sw::AdamW<T> optimizer({.learning_rate = T(3e-3), .max_grad_norm = T(1), .zero1 = dp_size > 1});
  sw::parallelize(model, tp);
  std::vector<std::int64_t> ids, targets;
  for (std::size_t t = 0; t < 2 * config.sequence; ++t) {
    ids.push_back(static_cast<std::int64_t>((t * 17 + 3) % config.vocabulary));
    targets.push_back(static_cast<std::int64_t>((t * 17 + 20) % config.vocabulary));
  }
  std::vector<double> out;
  for (int step = 0; step < steps; ++step) {
    auto const logits = model.forward(ids);  // every dp rank the same batch: the losses stay comparable
    auto const result = models::llama_loss(tp, logits, targets, config.vocabulary);
    model.backward(result.dlogits);
    optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
    out.push_back(static_cast<double>(result.loss));
  }
  return out;
}

/// The four layouts in T; the largest difference of their losses from the unsharded run's.
template <class T, class World>
double worst_difference(World& world, models::LlamaConfig const& config, int steps, std::vector<double>& serial) {
  int const dp_size = world.size() % 2 == 0 ? 2 : 1;
  serial = losses<T, sw::serial_plan>(world, config, steps, 1);
  std::vector<std::vector<double>> runs;
  if constexpr (plans_compiled >= 2)
    runs.push_back(losses<T, models::llama_plan<false, true>>(world, config, steps, 1));
  if constexpr (plans_compiled >= 3) runs.push_back(losses<T, models::llama_plan<true, true>>(world, config, steps, 1));
  if constexpr (!per_plan_probe)
    runs.push_back(losses<T, models::llama_plan<false, true>>(world, config, steps, dp_size));
  else if constexpr (plans_compiled >= 4)
    runs.push_back(losses<T, models::llama_plan<false, false>>(world, config, steps, 1));
  double worst = 0;
  for (auto const& run : runs)
    for (int s = 0; s < steps; ++s) worst = std::max(worst, std::fabs(run[s] - serial[s]));
  return worst;
}

int main(int argc, char** argv) {
  int const steps = argc > 1 ? std::atoi(argv[1]) : 3;
  if (steps < 2) {
    std::fprintf(stderr, "bench_eight_variants: needs at least 2 steps (the loss must go down), got %s\n", argv[1]);
    return 2;
  }
  models::LlamaConfig config;
  config.vocabulary = 64, config.dim = 32, config.layers = 2, config.heads = 4, config.kv_heads = 2;
  config.hidden = 64, config.sequence = 16;
  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/2, [&](auto& world) {
    // Sharded sums add in another order: agreement to 1e-4 in float and 1e-10 in double.
    std::vector<double> serial_float, serial_double;
    double const worst_float = worst_difference<float>(world, config, steps, serial_float);
    double worst_double = 0;
    if constexpr (per_plan_probe)
      serial_double = serial_float;
    else
      worst_double = worst_difference<double>(world, config, steps, serial_double);
    bool const ok = worst_float <= 1e-4 && worst_double <= 1e-10 && serial_double.back() < serial_double.front();
    if (world.rank() == 0) {
      std::printf(
          "eight variants on %d ranks, %d steps: loss %.5f -> %.5f, layouts agree to %.1e (float), %.1e "
          "(double)  %s\n",
          world.size(), steps, serial_double.front(), serial_double.back(), worst_float, worst_double,
          ok ? "ok" : "WRONG");
      if (!ok) exit_code = 1;
    }
  });
  return exit_code;
}
