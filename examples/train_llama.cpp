// Trains a small Llama-style model on real English text — the GNU GPL every Debian system ships — at the
// character level, sharded two ways at once: data parallel over "dp" (ZeRO-1: each dp rank keeps half of the
// optimizer state) and tensor + sequence parallel over "tp", exactly as torchtitan shards Llama.
//
//   ./train_llama [steps] [text file]      # 4 ranks on threads: dp 2 x tp 2 (SHARDWISE_THREADS=n for others)
//   mpiexec -n 4 ./train_llama             # the same on 4 MPI processes
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

int main(int argc, char** argv) {
  int const steps = argc > 1 ? std::atoi(argv[1]) : 300;
  std::string const path = argc > 2 ? argv[2] : "/usr/share/common-licenses/GPL-3";
  std::ifstream file(path, std::ios::binary);
  std::string const text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.size() < 1000) {
    std::fprintf(stderr, "train_llama: cannot read a text of at least 1000 bytes from %s\n", path.c_str());
    return 2;
  }

  models::LlamaConfig config;
  config.vocabulary = 256;  // bytes
  config.dim = 128, config.layers = 2, config.heads = 4, config.kv_heads = 2, config.hidden = 352;
  config.sequence = 64;
  constexpr int sequences_per_step = 8;

  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    int const dp_size = world.size() % 2 == 0 ? 2 : 1;
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, world.size() / dp_size});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);

    models::Llama<float, models::llama_plan<true>> model(config);  // sequence parallel, embeddings parallel
    sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f, .zero1 = true});
    sw::parallelize(model, tp);

    std::mt19937 rng(42);  // the same on every rank: each dp rank then takes its own sequences
    std::uniform_int_distribution<std::size_t> start(0, text.size() - config.sequence - 1);
    int const mine = sequences_per_step / dp_size;
    std::vector<std::int64_t> ids, targets;
    auto const began = std::chrono::steady_clock::now();
    double first_loss = 0, last_loss = 0;
    for (int step = 1; step <= steps; ++step) {
      ids.clear(), targets.clear();
      for (int b = 0; b < sequences_per_step; ++b) {
        std::size_t const s = start(rng);
        if (b / mine != dp.rank()) continue;
        for (std::size_t t = 0; t < config.sequence; ++t) {
          ids.push_back(static_cast<unsigned char>(text[s + t]));
          targets.push_back(static_cast<unsigned char>(text[s + t + 1]));
        }
      }
      // The logits go straight in: the loss writes their gradient into their storage.
      auto const result = models::llama_loss(tp, model.forward(ids), targets, config.vocabulary);
      model.backward(result.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      float const loss = sw::all_reduce(dp, result.loss, sw::Avg{});  // the mean over the dp ranks' sequences
      if (step == 1) first_loss = loss;
      last_loss = loss;
      if (world.rank() == 0 && (step % 25 == 0 || step == 1)) {
        double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
        std::printf("step %4d/%d (%3d%%)  loss %.4f  %7.0f tokens/s\n", step, steps, 100 * step / steps, loss,
                    double(step) * sequences_per_step * double(config.sequence) / seconds);
        std::fflush(stdout);
      }
    }
    if (world.rank() == 0) {
      std::printf(
          "%s on %d ranks (dp %d x tp %d, sequence parallel, ZeRO-1): loss %.3f -> %.3f, %zu optimizer "
          "state elements on this rank\n",
          world.size() > 0 && sw::launched_by_mpi() ? "MPI" : "threads", world.size(), dp_size, world.size() / dp_size,
          first_loss, last_loss, optimizer.state_elements());
      // Every digit of the float, so that two runs can be compared exactly (scripts/two_hosts.sh does).
      std::printf("final loss %.9g\n", last_loss);
      if (!(last_loss < first_loss)) {
        std::printf("WRONG: the loss did not go down\n");
        exit_code = 1;
      }
    }
  });
  return exit_code;
}
