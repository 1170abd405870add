// The C++ half of the outside check of pipeline training against torch.distributed.pipelining: shardwise's
// Llama (llama_pipeline_cases::config(): 4 blocks, untied) cut into 2 stages (models::LlamaStage) on 2 threads
// and trained by sw::run_pipeline_step for 5 AdamW steps of 4 microbatches, once with GPipe and once with 1F1B;
// the loop is llama_pipeline_cases::train's, with a clipping threshold below every step's norm. Writes into DIR
// the initial weights of the unsharded model under transformers' names (weights/NAME.npy), the token ids and
// targets each microbatch was fed (ids.npy, targets.npy: [step, microbatch, sequence, token]), and per schedule
// the step losses and global gradient norms (gpipe/, 1f1b/). pipeline_reference.py trains LlamaForCausalLM split
// into the same stages with ScheduleGPipe and Schedule1F1B on gloo and compares; it shares no code with this file.
#define DOCTEST_CONFIG_DISABLE  // config() and batch() live in doctest case headers; nothing is checked here

#include <cstdio>
#include <filesystem>
#include <shardwise/models/llama_names.hpp>
#include <span>
#include <string>
#include <vector>

#include "cases/llama_pipeline_cases.hpp"
#include "npy.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

constexpr int steps = 5, stages = 2, microbatches = 4, per_micro = 2;  // sequences per microbatch

/// train()'s optimizer but for max_grad_norm: its 1.0 is above every norm of these 5 steps (0.87-0.96), so the
/// clipping over both stages would go untested; 0.5 clips every step (pipeline_reference.py checks it).
sw::AdamWOptions<float> adamw() { return {.learning_rate = 3e-3f, .max_grad_norm = 0.5f}; }

/// The unsharded model's parameters (the stages are built from the same seeds) under transformers' names.
void write_weights(fs::path const& dir) {
  fs::create_directories(dir);
  models::Llama<float> model(llama_pipeline_cases::config());
  sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
    npy::write(dir / (sw::transformers_llama_name(name) + ".npy"), sw::full_tensor(p));
  });
}

/// Token ids or targets of every step's microbatches: [step][microbatch] -> per_micro whole sequences.
using Batches = std::vector<std::vector<std::vector<std::int64_t>>>;

void write_batches(fs::path const& path, Batches const& batches) {
  std::vector<double> flat;
  for (auto const& step : batches)
    for (auto const& micro : step) flat.insert(flat.end(), micro.begin(), micro.end());
  npy::write(path, flat.data(), {steps, microbatches, per_micro, long(llama_pipeline_cases::config().sequence)});
}

/// llama_pipeline_cases::train at dp 1, pp 2: the losses (mean over microbatches) and norms of every step, and
/// the ids and targets fed (on rank 0).
template <class Schedule>
void train(fs::path const& dir, Schedule const& schedule) {
  auto const c = llama_pipeline_cases::config();
  sw::run_threads(stages, [&](auto& world) {
    auto const pp = sw::make_mesh<"pp">(world, {stages});
    auto const serial = sw::make_mesh<"dp">(sw::serial_world(), {1});
    models::LlamaStage<float> stage(c, sw::stage_split(c.layers, stages), pp.rank());
    sw::AdamW<float> optimizer(adamw());
    Batches ids(steps, Batches::value_type(microbatches)), targets = ids;
    std::vector<double> losses, norms;
    for (int step = 0; step < steps; ++step) {
      auto& x = ids[std::size_t(step)];
      auto& y = targets[std::size_t(step)];
      for (int m = 0; m < microbatches; ++m)
        llama_cases::batch(c, step, microbatches * per_micro, m * per_micro, per_micro, x[std::size_t(m)],
                           y[std::size_t(m)]);
      float step_loss = 0;  // on the last stage: each microbatch's mean cross-entropy over microbatches
      auto input = [&](int m) { return std::span<const std::int64_t>(x[std::size_t(m)]); };
      auto loss_gradient = [&](int m, auto const& h) {
        auto result = stage.head_loss(serial, h, y[std::size_t(m)], 1.0f / float(microbatches));
        step_loss += result.loss / float(microbatches);
        return result.gradient;
      };
      sw::run_pipeline_step(schedule, pp, std::span(&stage, 1), microbatches, input, loss_gradient);
      norms.push_back(optimizer.step(sw::finish_gradients(stage), serial, pp));
      sw::zero_grad(stage);
      losses.push_back(sw::all_reduce(pp, stage.is_last() ? step_loss : 0.0f, sw::Sum{}));
    }
    if (world.rank() != 0) return;  // losses and norms are the same on both ranks
    fs::create_directories(dir);
    npy::write(dir / "losses.npy", losses.data(), {steps});
    npy::write(dir / "norms.npy", norms.data(), {steps});
    write_batches(dir / "ids.npy", ids);
    write_batches(dir / "targets.npy", targets);
  });
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: pipeline_dump OUTPUT_DIR\n");
    return 2;
  }
  fs::path const dir = argv[1];
  write_weights(dir / "weights");
  train(dir / "gpipe", sw::GPipe{});
  train(dir / "1f1b", sw::OneFOneB{});
  std::puts("pipeline_dump: written");
  return 0;
}
