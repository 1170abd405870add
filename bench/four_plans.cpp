// The compile-time benchmark's second file (bench/compile_time.sh, docs/build-time.md): a user's program that
// trains the Llama model under four plans — unsharded, tensor parallel with parallel or replicated embeddings,
// and tensor + sequence parallel — on whatever world sw::launch gives it. Run, it also checks what it compiles:
// the sharded plans' losses over a few steps equal the unsharded plan's.
//
//   bench_four_plans [steps]        # 2 thread ranks; SHARDWISE_THREADS=n or mpiexec for others
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

template <class Plan, class World>
std::vector<float> losses(World& world, models::LlamaConfig const& config, int steps) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, world.size()});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  models::Llama<float, Plan> model(config);
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  sw::parallelize(model, tp);
  std::vector<std::int64_t> ids, targets;
  for (std::size_t t = 0; t < 2 * config.sequence; ++t) {
    ids.push_back(static_cast<std::int64_t>((t * 17 + 3) % config.vocabulary));
    targets.push_back(static_cast<std::int64_t>((t * 17 + 20) % config.vocabulary));
  }
  std::vector<float> out;
  for (int step = 0; step < steps; ++step) {
    auto const logits = model.forward(ids);
    auto const result = models::llama_loss(tp, logits, targets, config.vocabulary);
    model.backward(result.dlogits);
    optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
    out.push_back(result.loss);
  }
  return out;
}

int main(int argc, char** argv) {
  int const steps = argc > 1 ? std::atoi(argv[1]) : 3;
  if (steps < 2) {
    std::fprintf(stderr, "bench_four_plans: needs at least 2 steps (the loss must go down), got %s\n", argv[1]);
    return 2;
  }
  models::LlamaConfig config;
  config.vocabulary = 64, config.dim = 32, config.layers = 2, config.heads = 4, config.kv_heads = 2;
  config.hidden = 64, config.sequence = 16;
  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/2, [&](auto& world) {
    std::vector<std::vector<float>> const runs = {
        losses<sw::serial_plan>(world, config, steps),
        losses<models::llama_plan<false, false>>(world, config, steps),
        losses<models::llama_plan<false, true>>(world, config, steps),
        losses<models::llama_plan<true, true>>(world, config, steps),
    };
    double worst = 0;  // against the unsharded plan; fp32 sums in another order: agreement to 1e-4
    for (auto const& run : runs)
      for (int s = 0; s < steps; ++s) worst = std::max(worst, double(std::fabs(run[s] - runs[0][s])));
    if (world.rank() == 0) {
      std::printf("four plans on %d ranks, %d steps: loss %.5f -> %.5f, plans agree to %.1e  %s\n", world.size(), steps,
                  runs[0].front(), runs[0].back(), worst, worst <= 1e-4 ? "ok" : "WRONG");
      if (!(worst <= 1e-4) || !(runs[0].back() < runs[0].front())) exit_code = 1;
    }
  });
  return exit_code;
}
