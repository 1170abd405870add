// The C++ half of the outside check of FSDP against PyTorch's FSDP2 (torch.distributed.fsdp.fully_shard):
// shardwise's Llama (llama_cases::small_config(): 2 blocks, untied, the FSDP tests' model) under
// sw::fully_shard<fsdp_policy<full_shard, wrap_paths<"layers.*">>> on a 1-D dp mesh of 2 threads, trained for 5
// AdamW steps with global-norm clipping below every step's norm; each dp rank takes its own 2 of the step's 4
// sequences (fsdp_cases::train_steps' batches). Writes into DIR the initial weights of the unsharded model under
// transformers' names (weights/NAME.npy), the token ids and targets each rank was fed (ids.npy, targets.npy:
// [step, rank, sequence, token]), each rank's loss per step (losses.npy: [step, rank]), the global gradient norm
// AdamW::step returned per step (norms.npy), every parameter after the 5 steps, gathered whole (final/NAME.npy),
// all of these under fp32/ and again under bf16/ for the run with mixed_precision<Eigen::bfloat16, float>,
// and the sharded checkpoint of the trained model, each rank's rows (checkpoint/), which the test consolidates
// with `shardwise consolidate --names transformers-llama` for transformers to load.
// fsdp_reference.py trains LlamaForCausalLM under fully_shard on 2 gloo processes and compares; it shares no code
// with this file.
#define DOCTEST_CONFIG_DISABLE  // the config, batches and max_norm live in doctest case headers; nothing is checked

#include <cstdio>
#include <filesystem>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/models/llama_names.hpp>
#include <string>
#include <vector>

#include "cases/fsdp_cases.hpp"
#include "npy.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

constexpr int steps = 5, dp_size = 2, sequences = 4, per_rank = sequences / dp_size;

/// fsdp_cases::train_steps' optimizer: max_grad_norm 0.1 is far below every step's norm here (1.14-1.19), so every
/// step clips (fsdp_reference.py checks that on torch's norms).
sw::AdamWOptions<float> adamw() { return {.learning_rate = 3e-3f, .max_grad_norm = fsdp_cases::max_norm}; }

/// Every parameter of `model` (whole, unsharded) under transformers' names.
template <class Model>
void write_parameters(fs::path const& dir, Model& model) {
  fs::create_directories(dir);
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    npy::write(dir / (sw::transformers_llama_name(name) + ".npy"), sw::full_tensor(p));
  });
}

using Tokens = std::vector<std::vector<std::vector<std::int64_t>>>;  // [step][rank] -> per_rank sequences

/// What each rank saw and computed, per step; filled by the threads at [step][rank], written after they join.
struct Dump {
  Tokens ids, targets;
  std::vector<double> losses;  // [step * dp_size + rank]
  std::vector<double> norms;   // [step], from rank 0 (every rank has it)
};

void write_tokens(fs::path const& path, Tokens const& tokens) {
  std::vector<double> flat;
  for (auto const& step : tokens)
    for (auto const& rank : step) flat.insert(flat.end(), rank.begin(), rank.end());
  npy::write(path, flat.data(), {steps, dp_size, per_rank, long(llama_cases::small_config().sequence)});
}

/// fsdp_cases::train_steps at dp 2 on threads under Precision, recording the batches and each rank's loss; the
/// results go to DIR/<run>/ (losses.npy, norms.npy, final/), the batches and the fp32 run's checkpoint to DIR.
template <class Precision>
void train(fs::path const& dir, std::string const& run) {
  auto const c = llama_cases::small_config();
  Dump dump{.ids = Tokens(steps, Tokens::value_type(dp_size)),
            .targets = Tokens(steps, Tokens::value_type(dp_size)),
            .losses = std::vector<double>(steps * dp_size),
            .norms = std::vector<double>(steps)};
  sw::run_threads(dp_size, [&](auto& world) {
    auto const dp = sw::make_mesh<"dp">(world, {dp_size});
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});  // no tensor parallelism: llama_loss over one rank
    models::Llama<float> model(c);  // the same seeds on both ranks: equal values before sharding, as FSDP needs
    auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, fsdp_cases::blocks, Precision>>(model, dp);
    sw::AdamW<float> optimizer(adamw());
    int const rank = dp.rank();
    for (int step = 0; step < steps; ++step) {
      auto& ids = dump.ids[std::size_t(step)][std::size_t(rank)];
      auto& targets = dump.targets[std::size_t(step)][std::size_t(rank)];
      llama_cases::batch(c, step, sequences, rank * per_rank, per_rank, ids, targets);
      auto const logits = sharded.forward(ids);
      auto result = models::llama_loss(tp, logits, targets, c.vocabulary);
      sharded.backward(result.dlogits);
      float const norm = optimizer.step(sharded);
      sw::zero_grad(sharded);
      dump.losses[std::size_t(step * dp_size + rank)] = result.loss;
      if (rank == 0) dump.norms[std::size_t(step)] = norm;
    }
    if (run == "fp32") sw::save_sharded(sharded, dir / "checkpoint", steps);  // each rank its rows, to consolidate
    sharded.unshard();  // collective: every rank then holds the whole trained parameters
    if (rank == 0) write_parameters(dir / run / "final", sharded.model());
    sharded.reshard();
  });
  npy::write(dir / run / "losses.npy", dump.losses.data(), {steps, dp_size});
  npy::write(dir / run / "norms.npy", dump.norms.data(), {steps});
  write_tokens(dir / "ids.npy", dump.ids);
  write_tokens(dir / "targets.npy", dump.targets);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: fsdp_dump OUTPUT_DIR\n");
    return 2;
  }
  fs::path const dir = argv[1];
  {
    models::Llama<float> initial(llama_cases::small_config());  // built from the seeds the trained ones use
    write_parameters(dir / "weights", initial);
  }
  train<sw::full_precision>(dir, "fp32");
  train<sw::mixed_precision<Eigen::bfloat16, float>>(dir, "bf16");  // torchtitan's default policy
  std::puts("fsdp_dump: written");
  return 0;
}
