// Trains the Llama model of train_llama cut into pipeline stages: 4 ranks as pp 2 x tp 2 — each pipeline stage
// holds half of the blocks (the first also the embedding, the last the final norm, the output and the loss),
// each cut over tp with sequence parallelism — running 4 microbatches per step with the 1F1B schedule.
//
//   ./pipeline_llama [steps] [text file]      # 4 ranks on threads (SHARDWISE_THREADS=n: pp n/2 x tp 2)
//   mpiexec -n 4 ./pipeline_llama             # the same on 4 MPI processes
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <random>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
#include <string>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

int main(int argc, char** argv) {
  int const steps = argc > 1 ? std::atoi(argv[1]) : 200;
  std::string const path = argc > 2 ? argv[2] : "/usr/share/common-licenses/GPL-3";
  std::ifstream file(path, std::ios::binary);
  std::string const text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (text.size() < 1000) {
    std::fprintf(stderr, "pipeline_llama: cannot read a text of at least 1000 bytes from %s\n", path.c_str());
    return 2;
  }

  models::LlamaConfig config;
  config.vocabulary = 256;  // bytes
  config.dim = 128, config.layers = 4, config.heads = 4, config.kv_heads = 2, config.hidden = 352;
  config.sequence = 64;
  constexpr int microbatches = 4, sequences_per_microbatch = 2;

  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    int const tp_size = world.size() % 2 == 0 ? 2 : 1;
    auto const mesh = sw::make_mesh<"pp", "tp">(world, {world.size() / tp_size, tp_size});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const pp = sw::submesh<"pp">(mesh);

    // This rank builds only its stage: its blocks, and the embedding or the head if it is the first or last.
    std::vector<models::LlamaStage<float, models::llama_plan<true>>> stage;
    stage.emplace_back(config, sw::stage_split(config.layers, pp.size()), pp.rank());
    sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
    sw::parallelize(stage.front(), tp);

    std::mt19937 rng(42);  // the same on every rank
    std::uniform_int_distribution<std::size_t> start(0, text.size() - config.sequence - 1);
    std::vector<std::int64_t> ids, targets;  // the step's batch, whole sequences
    float first_loss = 0, last_loss = 0;
    for (int step = 1; step <= steps; ++step) {
      ids.clear(), targets.clear();
      for (int b = 0; b < microbatches * sequences_per_microbatch; ++b) {
        std::size_t const s = start(rng);
        for (std::size_t t = 0; t < config.sequence; ++t) {
          ids.push_back(static_cast<unsigned char>(text[s + t]));
          targets.push_back(static_cast<unsigned char>(text[s + t + 1]));
        }
      }
      // Equal microbatches of whole sequences (a batch they do not divide is refused with the counts).
      auto const id_parts = sw::split_microbatches(std::span<std::int64_t const>(ids), config.sequence, microbatches);
      auto const target_parts =
          sw::split_microbatches(std::span<std::int64_t const>(targets), config.sequence, microbatches);
      float loss = 0;  // on the last stage: the mean over the microbatches
      sw::run_pipeline_step(
          sw::OneFOneB{}, pp, std::span(stage), microbatches,
          [&](int m) { return id_parts[static_cast<std::size_t>(m)]; },  // the first stage's input
          [&](int m, auto const& h) {                                    // the last stage's loss
            auto const result =
                stage.back().head_loss(tp, h, target_parts[static_cast<std::size_t>(m)], 1.0f / microbatches);
            loss += result.loss / microbatches;
            return result.gradient;
          });
      optimizer.step(sw::finish_gradients(stage.front()), sw::make_mesh<"dp">(sw::serial_world(), {1}), pp);
      sw::zero_grad(stage.front());
      loss = sw::all_reduce(pp, stage.front().is_last() ? loss : 0.0f, sw::Sum{});  // from the last stage
      if (step == 1) first_loss = loss;
      last_loss = loss;
      if (world.rank() == 0 && (step % 25 == 0 || step == 1)) {
        std::printf("step %4d/%d  loss %.4f\n", step, steps, loss);
        std::fflush(stdout);
      }
    }
    if (world.rank() == 0) {
      std::printf("%s on %d ranks (pp %d x tp %d, 1F1B, %d microbatches): loss %.3f -> %.3f\n",
                  sw::launched_by_mpi() ? "MPI" : "threads", world.size(), pp.size(), tp_size, microbatches, first_loss,
                  last_loss);
      if (!(last_loss < first_loss)) {
        std::printf("WRONG: the loss did not go down\n");
        exit_code = 1;
      }
    }
  });
  return exit_code;
}
