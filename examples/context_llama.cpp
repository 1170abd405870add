// Trains the Llama model of train_llama on long sequences cut over context-parallel ranks: 4 ranks as cp 2 x tp 2.
// Each sequence of 512 bytes is cut into head-tail chunks (rank 0 of cp holds the first and the last quarter,
// rank 1 the middle); every layer works on this rank's tokens only, and the attention passes keys and values
// round the cp ring (sw::ring_attention). The gradients are averaged over dp x cp: the ranks that hold the same
// parameters and see other tokens.
//
//   ./context_llama [steps] [text file]      # 4 ranks on threads (SHARDWISE_THREADS=n: cp n/2 x tp 2)
//   mpiexec -n 4 ./context_llama             # the same on 4 MPI processes
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <shardwise/context.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

int main(int argc, char** argv) {
  int const steps = argc > 1 ? std::atoi(argv[1]) : 100;
  std::string const path = argc > 2 ? argv[2] : "/usr/share/common-licenses/GPL-3";
  std::ifstream file(path, std::ios::binary);
  std::string const text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.size() < 4096) {
    std::fprintf(stderr, "context_llama: cannot read a text of at least 4096 bytes from %s\n", path.c_str());
    return 2;
  }

  models::LlamaConfig config;
  config.vocabulary = 256;  // bytes
  config.dim = 128, config.layers = 2, config.heads = 4, config.kv_heads = 2, config.hidden = 352;
  config.sequence = 512;
  constexpr int sequences = 2;  // per step

  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    int const tp_size = world.size() % 2 == 0 ? 2 : 1;
    int const cp_size = world.size() / tp_size;
    auto const mesh = sw::make_mesh<"cp", "tp">(world, {cp_size, tp_size});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const cp = sw::submesh<"cp">(mesh);

    models::Llama<float, models::llama_plan<true>> model(config);
    sw::parallelize(model, tp);
    auto const context = sw::context_parallelize(model, cp, {config.sequence, cp_size}, sw::context_method::ring);
    sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});

    std::mt19937 rng(42);  // the same on every rank: every cp rank takes its own tokens of the same sequences
    std::uniform_int_distribution<std::size_t> start(0, text.size() - config.sequence - 1);
    std::vector<std::int64_t> ids, targets;
    float first_loss = 0, last_loss = 0;
    for (int step = 1; step <= steps; ++step) {
      ids.clear(), targets.clear();
      for (int b = 0; b < sequences; ++b) {  // whole sequences, the same on every rank
        std::size_t const s = start(rng);
        for (std::size_t p = 0; p < config.sequence; ++p) {
          ids.push_back(static_cast<unsigned char>(text[s + p]));
          targets.push_back(static_cast<unsigned char>(text[s + p + 1]));
        }
      }
      auto const logits = model.forward(context->my_tokens(ids));  // this rank's tokens of each sequence
      auto result = models::llama_loss(tp, logits, context->my_tokens(targets), config.vocabulary);
      float const weight = static_cast<float>(context->mean_weight());  // this rank's share of the tokens
      result.dlogits.local *= weight;
      model.backward(result.dlogits);
      optimizer.step(sw::finish_gradients(model), cp);  // averaged over cp: the same parameters, other tokens
      sw::zero_grad(model);
      float const loss = sw::all_reduce(cp, result.loss * weight, sw::Avg{});
      if (step == 1) first_loss = loss;
      last_loss = loss;
      if (world.rank() == 0 && (step % 25 == 0 || step == 1)) {
        std::printf("step %4d/%d  loss %.4f\n", step, steps, loss);
        std::fflush(stdout);
      }
    }
    if (world.rank() == 0) {
      std::printf(
          "%s on %d ranks (cp %d x tp %d, ring attention, %zu of %zu tokens a sequence here): loss %.3f -> %.3f\n",
          sw::launched_by_mpi() ? "MPI" : "threads", world.size(), cp_size, tp_size, context->tokens(), config.sequence,
          first_loss, last_loss);
      if (!(last_loss < first_loss)) {
        std::printf("WRONG: the loss did not go down\n");
        exit_code = 1;
      }
    }
  });
  return exit_code;
}
