// Trains the Llama model of train_llama fully sharded: 4 ranks as FSDP dp 2 x TP 2 (torchtitan's 2-D layout).
// sw::fully_shard parallelizes the model over "tp" and shards every parameter, gradient and optimizer state
// over "dp"; each transformer block is a unit, gathered before its forward and backward and freed after them.
// At the end it saves a sharded checkpoint with the optimizer state and loads it into a model of another seed.
//
//   ./fsdp_llama [steps] [text file]      # 4 ranks on threads (SHARDWISE_THREADS=n: dp n/2 x tp 2)
//   mpiexec -n 4 ./fsdp_llama             # the same on 4 MPI processes
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
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
    std::fprintf(stderr, "fsdp_llama: cannot read a text of at least 1000 bytes from %s\n", path.c_str());
    return 2;
  }

  models::LlamaConfig config;
  config.vocabulary = 256;  // bytes
  config.dim = 128, config.layers = 4, config.heads = 4, config.kv_heads = 2, config.hidden = 352;
  config.sequence = 64;
  constexpr int sequences_per_rank = 4;

  int exit_code = 0;
  sw::launch(argc, argv, /*threads=*/4, [&](auto& world) {
    int const tp_size = world.size() % 2 == 0 ? 2 : 1;
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {world.size() / tp_size, tp_size});
    auto const dp = sw::submesh<"dp">(mesh);

    models::Llama<float, models::llama_plan<true>> model(config);
    using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;  // each block a unit
    auto sharded = sw::fully_shard<policy>(model, mesh);                         // TP over "tp", FSDP over "dp"
    sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});

    std::mt19937 rng(42);  // the same on every rank; each dp rank takes its own sequences of the batch
    std::uniform_int_distribution<std::size_t> start(0, text.size() - config.sequence - 1);
    std::vector<std::int64_t> ids, targets;
    float first_loss = 0, last_loss = 0;
    for (int step = 1; step <= steps; ++step) {
      ids.clear(), targets.clear();
      for (int b = 0; b < dp.size() * sequences_per_rank; ++b) {
        std::size_t const s = start(rng);
        if (b / sequences_per_rank != dp.rank()) continue;
        for (std::size_t t = 0; t < config.sequence; ++t) {
          ids.push_back(static_cast<unsigned char>(text[s + t]));
          targets.push_back(static_cast<unsigned char>(text[s + t + 1]));
        }
      }
      auto const logits = sharded.forward(ids);
      auto const result = models::llama_loss(sw::submesh<"tp">(mesh), logits, targets, config.vocabulary);
      sharded.backward(result.dlogits);
      optimizer.step(sharded);  // the shards, with their gradients averaged over dp
      sw::zero_grad(sharded);
      float const loss = sw::all_reduce(dp, result.loss, sw::Avg{});
      if (step == 1) first_loss = loss;
      last_loss = loss;
      if (world.rank() == 0 && (step % 25 == 0 || step == 1)) {
        std::printf("step %4d/%d  loss %.4f\n", step, steps, loss);
        std::fflush(stdout);
      }
    }

    // A checkpoint: every (dp, tp) rank writes its shards and AdamW moments; a model built from another seed
    // loads them (rank 0 alone reading the files, sending each rank its shards) and gives the same loss.
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dir = std::filesystem::temp_directory_path() /
                     (sw::launched_by_mpi() ? "shardwise_fsdp_llama_mpi" : "shardwise_fsdp_llama_threads");
    sw::save_sharded(sharded, optimizer, tp, dir, steps);
    auto other = config;
    other.seed += 1;
    models::Llama<float, models::llama_plan<true>> fresh(other);
    auto resumed = sw::fully_shard<policy>(fresh, mesh);
    sw::AdamW<float> resumed_optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
    (void)sw::load_sharded(resumed, resumed_optimizer, tp, dir, {.only_rank0_reads = true});
    auto const loss_of = [&](auto& s) {
      return models::llama_loss(tp, s.forward(ids), targets, config.vocabulary).loss;
    };
    bool const same = loss_of(sharded) == loss_of(resumed) && resumed_optimizer.steps() == optimizer.steps();
    world.barrier();
    if (world.rank() == 0) std::filesystem::remove_all(dir);
    if (world.rank() == 0) {
      std::printf("checkpoint in %s: loaded into a model of another seed, %s\n", dir.c_str(),
                  same ? "the same loss" : "WRONG: another loss");
      if (!same) exit_code = 1;
      std::printf("%s on %d ranks (FSDP dp %d x TP %d, full shard): loss %.3f -> %.3f\n",
                  sw::launched_by_mpi() ? "MPI" : "threads", world.size(), dp.size(), tp_size, first_loss, last_loss);
      if (!(last_loss < first_loss)) {
        std::printf("WRONG: the loss did not go down\n");
        exit_code = 1;
      }
    }
  });
  return exit_code;
}
