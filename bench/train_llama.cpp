// Training throughput and per-rank memory of the Llama model at TP 1, 2, 4 and dp 2 x tp 2 (sequence
// parallel, ZeRO-1 on dp), on the thread mesh, in one run. Memory is counted, per rank, as the elements held
// in parameters, gradients and optimizer state, beside the ideal (parameters / tp; state / (tp x dp)).
//
//   bench_train_llama [--steps 10] [--smoke]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

extern "C" void openblas_set_num_threads(int);

namespace sw = shardwise;
namespace models = shardwise::models;

struct Result {
  double tokens_per_second = 0;
  std::size_t parameters = 0, gradients = 0, state = 0;
};

template <class Plan>
Result measure(int ranks, int dp_size, int steps, models::LlamaConfig const& c, int sequences, bool zero1) {
  Result result;
  sw::run_threads(ranks, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, ranks / dp_size});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    models::Llama<float, Plan> model(c);
    sw::AdamW<float> optimizer({.learning_rate = 1e-3f, .max_grad_norm = 1.0f, .zero1 = zero1});
    sw::parallelize(model, tp);
    int const mine = sequences / dp_size;
    std::vector<std::int64_t> ids, targets;
    for (int b = 0; b < mine; ++b)
      for (std::size_t t = 0; t < c.sequence; ++t) {
        ids.push_back(static_cast<std::int64_t>((b * 131 + t * 17 + dp.rank() * 7) % c.vocabulary));
        targets.push_back(static_cast<std::int64_t>((b * 131 + t * 17 + 1) % c.vocabulary));
      }
    std::vector<double> times;
    for (int step = 0; step <= steps; ++step) {  // step 0 is warm-up
      sw::barrier(mesh);
      auto const start = std::chrono::steady_clock::now();
      auto const logits = model.forward(ids);
      auto const loss = models::llama_loss(tp, logits, targets, c.vocabulary);
      model.backward(loss.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      sw::barrier(mesh);
      if (step) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(times.begin(), times.end());
    if (world.rank() == 0) {
      result.tokens_per_second = double(sequences) * double(c.sequence) / times[times.size() / 2];
      sw::detail::for_each_parameter(model, [&](auto const& p) {
        result.parameters += static_cast<std::size_t>(p.value->size());
        result.gradients += static_cast<std::size_t>(p.grad->size());
      });
      result.state = optimizer.state_elements();
    }
  });
  return result;
}

int main(int argc, char** argv) {
  int steps = 10;
  models::LlamaConfig c;
  c.vocabulary = 2048, c.dim = 256, c.layers = 4, c.heads = 8, c.kv_heads = 4, c.hidden = 704, c.sequence = 128;
  int sequences = 8;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--steps" && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (a == "--smoke")
      steps = 1, c.vocabulary = 64, c.dim = 32, c.layers = 1, c.hidden = 64, c.sequence = 8, sequences = 4;
    else {
      std::fprintf(stderr, "usage: bench_train_llama [--steps N] [--smoke]\n");
      return 2;
    }
  }
  openblas_set_num_threads(1);
  std::printf(
      "# Llama training, fp32, vocabulary %zu, dim %zu, %zu layers, %zu heads (%zu kv), hidden %zu, %d x %zu "
      "tokens per step, median of %d steps, thread mesh on %d cores\n",
      c.vocabulary, c.dim, c.layers, c.heads, c.kv_heads, c.hidden, sequences, c.sequence, steps, 2);
  auto const serial = measure<models::llama_plan<false>>(1, 1, steps, c, sequences, false);
  std::printf(
      "| mesh | tokens/s | vs TP 1 | parameters / rank | ideal | gradients / rank | optimizer state / rank | "
      "ideal |\n|---|---|---|---|---|---|---|---|\n");
  auto row = [&](char const* name, Result const& r, int tp, int dp) {
    std::printf("| %s | %.0f | %.2f | %zu | %zu | %zu | %zu | %zu |\n", name, r.tokens_per_second,
                r.tokens_per_second / serial.tokens_per_second, r.parameters, serial.parameters / std::size_t(tp),
                r.gradients, r.state, 2 * serial.parameters / std::size_t(tp * dp));
  };
  row("TP 1", serial, 1, 1);
  row("TP 2 (sequence parallel)", measure<models::llama_plan<true>>(2, 1, steps, c, sequences, false), 2, 1);
  row("TP 4 (sequence parallel, 4 threads on 2 cores)",
      measure<models::llama_plan<true>>(4, 1, steps, c, sequences, false), 4, 1);
  row("dp 2 x tp 2, ZeRO-1 (4 threads on 2 cores)", measure<models::llama_plan<true>>(4, 2, steps, c, sequences, true),
      2, 2);
  return 0;
}
