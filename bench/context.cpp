// Context parallelism on the Llama model (sw::context_parallelize, ring attention, head-tail chunks): one
// training step's forward and backward of one long sequence, its tokens cut over the cp ranks (one MPI process
// each), after a first step:
//  - each rank's peak resident set during the step above what it held before, against what `shardwise plan`
//    counts for the layout (the activations and a backward's transients; activation memory scales as s / cp);
//  - the step's time and the job's tokens/s, to set beside cp 1 at the same sequence (a separate run).
//
//   mpiexec -n 1|2|4 --bind-to none bench_context [--sequence 32768] [--method ring|all-to-all]
//   bench_context --smoke   (threads, 2 ranks, 64 tokens: the binary works)
#include <malloc.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <shardwise/context.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/planner/llama.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "mfu.hpp"
#include "proc_status.hpp"

extern "C" void openblas_set_num_threads(int);

namespace sw = shardwise;
namespace models = shardwise::models;

namespace {

models::LlamaConfig config(std::size_t sequence) {
  models::LlamaConfig c;
  c.vocabulary = 256, c.dim = 128, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 256;
  c.sequence = sequence;
  return c;
}

/// One forward and backward of the sequence's tokens on this rank; its seconds.
template <class Model, class Tp>
double step(Model& model, Tp const& tp, sw::context_parallel const& context, models::LlamaConfig const& c) {
  std::vector<std::int64_t> ids, targets;
  for (std::int64_t p : context.positions()) {
    ids.push_back((p * 7919 + 13) % static_cast<std::int64_t>(c.vocabulary));
    targets.push_back((p * 104729 + 7) % static_cast<std::int64_t>(c.vocabulary));
  }
  auto const start = std::chrono::steady_clock::now();
  auto const logits = model.forward(ids);
  auto result = models::llama_loss(tp, logits, targets, c.vocabulary);
  result.dlogits.local *= static_cast<float>(context.mean_weight());
  model.backward(result.dlogits);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);  // one core per rank
  bool smoke = false;
  std::size_t sequence = 32768;
  auto method = sw::context_method::ring;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--smoke")) smoke = true, sequence = 64;
    if (!std::strcmp(argv[i], "--sequence") && i + 1 < argc) sequence = std::strtoull(argv[++i], nullptr, 10);
    if (!std::strcmp(argv[i], "--method") && i + 1 < argc)
      method = std::string(argv[++i]) == "all-to-all" ? sw::context_method::all_to_all : sw::context_method::ring;
  }
  auto const c = config(sequence);
  sw::launch(argc, argv, 2, [&](auto& world) {
    auto const cp = sw::make_mesh<"cp">(world, {world.size()});
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    models::Llama<float> model(c);
    auto const context = sw::context_parallelize(model, cp, {sequence, world.size()}, method);
    (void)step(model, tp, *context, c);  // a first step: the gradients allocated, buffers mapped
    sw::zero_grad(model);
    sw::drop_saved_activations(model);  // what the first step's forward kept: the second allocates its own
    malloc_trim(0);
    bool const reset = bench::reset_peak();
    double const before = bench::status_mib("VmRSS");
    double const seconds = step(model, tp, *context, c);
    double const peak = bench::status_mib("VmHWM");
    namespace planner = sw::planner;
    planner::layout l{1, 1, 1, 1};
    l.cp = static_cast<std::size_t>(world.size());
    auto const e = planner::estimate_layout(c, {1, sequence, planner::fp32}, l, {});
    double const mib = 1024.0 * 1024.0, planned = double(e.activation_bytes + e.working_bytes) / mib;
    double const slowest = sw::all_reduce(cp, seconds, sw::Max{});
    for (int r = 0; r < world.size(); ++r) {
      if (r == world.rank())
        std::printf(
            "RESULT cp %d rank %d: sequence %zu, %zu tokens here; peak %.1f MiB above the %.1f MiB held before the "
            "step%s; planned %.1f MiB (%.1f activations, %.1f transients); measured / planned %.3f\n",
            world.size(), world.rank(), sequence, context->tokens(), peak - before, before,
            reset ? "" : " (VmHWM not reset: may predate the step)", planned, double(e.activation_bytes) / mib,
            double(e.working_bytes) / mib, (peak - before) / planned);
      std::fflush(stdout);
      sw::barrier(cp);
    }
    if (world.rank() == 0) {
      auto whole = c;
      whole.sequence = sequence;  // the step's one sequence: 6 per token and weight, its causal attention
      double const mfu = bench::mfu(bench::llama_training_flops(whole, 1), slowest, world.size(),
                                    smoke ? 0.0 : bench::measure_core_peaks().fp32);
      std::printf("RESULT cp %d step (forward and backward, slowest rank): %.2f s, %.0f tokens/s; MFU %.2f\n",
                  world.size(), slowest, double(sequence) / slowest, mfu);
    }
  });
  (void)smoke;
  return 0;
}
