// Pipeline parallelism on the Llama model, in one run:
//  - step time against microbatches (a fixed batch of 8 sequences cut into m = 1, 2, 4, 8) for pp 2 and pp 4
//    with GPipe, 1F1B and ZB-H1, and the measured bubble — the share of the pipeline schedule's time (the step
//    without the optimizer) a rank spends outside its stage's forward, backward (B), weight gradients (W) and
//    loss, averaged over the ranks — beside the theoretical: the bubble of the schedule's own tables timed at
//    the measured F, B and W (sw::schedule_timeline: (p - 1) / (m + p - 1) for 1F1B with equal stages); ZBV
//    (two chunks per rank, the V) where the layers divide into 2p stages, and DualPipeV (the same V) where m >= 2p;
//  - tokens/s of pp 2 (1F1B, ZB-H1, ZBV and DualPipeV, m = 8), tp 2 (sequence parallel) and dp 2 (ZeRO-1) against one
//  rank, on
//    the same model and batch (the thread mesh);
//  - with `memory`, under mpiexec (one process per stage): each stage's peak resident set during one step,
//    above what it held before the step, for GPipe, 1F1B, and 1F1B with activation checkpointing per stage
//    (1f1b-recompute) and per block (1f1b-blocks); and, `memory fsdp-1f1b` under mpiexec -n 4, FSDP within the
//    stages (dp 2 x pp 2, full shard, a unit per block): each rank's peak above what it held before the step,
//    against the planner's figure beyond the shards (the root unit, one block and their gradients gathered whole,
//    the activations and a backward's transients).
//
//    Beside each, its MFU (bench/mfu.hpp), and the step time `shardwise plan` predicts for that layout
//    (shardwise::planner, fp32, this machine's measured values, or --machine FILE) and measured / predicted;
//
//   bench_pipeline [--steps 3] [--rounds 3] [--small] [--smoke] [--compare-only] [--machine FILE|calibrate]
//   mpiexec -n 2 bench_pipeline memory gpipe|1f1b|1f1b-recompute|1f1b-blocks [--small]
//   mpiexec -n 4 bench_pipeline memory fsdp-1f1b [--small]
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>
#include <shardwise/fsdp.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/pipeline/timeline.hpp>
#include <shardwise/planner/llama.hpp>
#include <shardwise/planner/machine_file.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
#include <string>
#include <vector>

#include "machine_flag.hpp"
#include "median.hpp"
#include "mfu.hpp"
#include "proc_status.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
using clock_type = std::chrono::steady_clock;

namespace {

/// The machine the predictions are for: the built-in one, `--machine FILE` (bench_machine's output from the
/// same session: this machine's speed moves between days by more than the predictions' target), or `--machine
/// calibrate` (measured in this process at its start: machine_flag.hpp).
sw::planner::machine predicted_machine;

constexpr int batch_sequences = 8;

models::LlamaConfig config(bool small) {
  models::LlamaConfig c;
  if (small) {  // the tests' size
    c.vocabulary = 64, c.dim = 32, c.layers = 4, c.heads = 4, c.kv_heads = 4, c.hidden = 64, c.sequence = 8;
  } else {
    c.vocabulary = 256, c.dim = 1024, c.layers = 4, c.heads = 16, c.kv_heads = 8, c.hidden = 2816, c.sequence = 128;
  }
  return c;
}

double seconds_since(clock_type::time_point start) {
  return std::chrono::duration<double>(clock_type::now() - start).count();
}

/// Token ids and targets of microbatch m of `microbatches` (the batch's sequences cut evenly).
struct Batch {
  std::vector<std::vector<std::int64_t>> ids, targets;
  Batch(models::LlamaConfig const& c, int microbatches, int first_sequence = 0, int sequences = batch_sequences)
      : ids(static_cast<std::size_t>(microbatches)), targets(ids.size()) {
    int const per = sequences / microbatches;
    for (int m = 0; m < microbatches; ++m)
      for (int b = first_sequence + m * per; b < first_sequence + (m + 1) * per; ++b)
        for (std::size_t t = 0; t < c.sequence; ++t) {
          ids[static_cast<std::size_t>(m)].push_back(static_cast<std::int64_t>((b * 131 + t * 17) % c.vocabulary));
          targets[static_cast<std::size_t>(m)].push_back(
              static_cast<std::int64_t>((b * 131 + t * 17 + 1) % c.vocabulary));
        }
  }
};

/// A stage that times its own forward, backward (B under a zero-bubble schedule) and weight-gradient work (W): the
/// busy time of a rank. Under B it collects the layers' put-off work and puts it off as one timed piece.
template <class Stage>
struct Timed {
  Stage stage;
  double forward_seconds = 0, backward_seconds = 0, weight_seconds = 0;
  SHARDWISE_CHILDREN(stage)
  SHARDWISE_SAVED()
  Timed(models::LlamaConfig const& c, sw::stage_split const& split, int index) : stage(c, split, index) {}
  template <class X>
  auto forward(X const& x) {
    auto const start = clock_type::now();
    auto y = stage.forward(x);
    forward_seconds += seconds_since(start);
    return y;
  }
  typename Stage::stream backward(typename Stage::stream const& dy) {
    auto* const later = sw::weight_gradients_deferred_to(stage);
    auto own = std::make_shared<sw::deferred_weight_gradients>();
    std::optional<sw::defer_weight_gradients<Stage>> into;
    if (later) into.emplace(stage, *own);
    auto const start = clock_type::now();
    auto dx = stage.backward(dy);
    backward_seconds += seconds_since(start);
    into.reset();
    if (later)
      later->defer([this, own] {
        auto const begin = clock_type::now();
        own->run();
        weight_seconds += seconds_since(begin);
      });
    return dx;
  }
  [[nodiscard]] double busy() const { return forward_seconds + backward_seconds + weight_seconds; }
  void reset() { forward_seconds = backward_seconds = weight_seconds = 0; }
};

struct Timing {
  double step_seconds = 0, bubble = 0;
  double forward = 0, backward = 0, weight = 0;  // one microbatch through one stage (F, B, W), mean over the ranks
};

/// Mean step time (after one warm-up step) and mean bubble over the ranks, pp stages on the thread mesh.
template <class Schedule>
Timing pipeline_timing(models::LlamaConfig const& c, int stages, int microbatches, int steps,
                       sw::stage_activations activations = sw::stage_activations::keep) {
  Timing timing;
  std::vector<double> bubble(static_cast<std::size_t>(stages)), f(bubble.size()), b(bubble.size()), w(bubble.size());
  sw::run_threads(stages, [&](auto& world) {
    auto const pp = sw::make_mesh<"pp">(world, {stages});
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    auto const shape = sw::shape_of<Schedule>(stages, microbatches);
    sw::stage_chunks<Timed<models::LlamaStage<float>>> stage;  // ZBV: two chunks, in the V
    for (int chunk = 0; chunk < shape.chunks_per_rank; ++chunk)
      stage.emplace_back(c, sw::stage_split(c.layers, shape.model_stages()), shape.stage_of(pp.rank(), chunk));
    sw::AdamW<float> optimizer({.learning_rate = 1e-3f, .max_grad_norm = 1.0f});
    Batch const batch(c, microbatches);
    double total = 0, busy = 0, pipelined = 0, forward = 0, backward = 0, weight = 0;
    for (int step = 0; step <= steps; ++step) {
      sw::barrier(pp);
      for (auto& chunk : stage) chunk.reset();
      auto const start = clock_type::now();
      sw::run_pipeline_step(
          Schedule{}, pp, std::span(stage), microbatches,
          [&](int m) { return std::span<const std::int64_t>(batch.ids[static_cast<std::size_t>(m)]); },
          [&](int m, auto const& h) {
            auto const head = clock_type::now();
            auto result = stage.back().stage.head_loss(tp, h, batch.targets[static_cast<std::size_t>(m)],
                                                       1.0f / float(microbatches));
            stage.back().forward_seconds += seconds_since(head);  // the head runs in F
            return result.gradient;
          },
          sw::pipeline_options{activations});
      sw::barrier(pp);
      double const pipeline_wall = seconds_since(start);  // the schedule alone: what its bubble is a share of
      optimizer.step(sw::finish_gradients(stage), sw::make_mesh<"dp">(sw::serial_world(), {1}), pp);
      sw::zero_grad(stage);
      sw::barrier(pp);
      double const wall = seconds_since(start);
      if (step > 0) total += wall, pipelined += pipeline_wall;
      for (auto const& t : stage)
        if (step > 0)
          busy += t.busy(), forward += t.forward_seconds, backward += t.backward_seconds, weight += t.weight_seconds;
    }
    auto const r = static_cast<std::size_t>(pp.rank());
    double const per = double(steps) * double(microbatches) * double(shape.chunks_per_rank);  // chunk-microbatches
    bubble[r] = 1.0 - busy / pipelined, f[r] = forward / per, b[r] = backward / per, w[r] = weight / per;
    if (pp.rank() == 0) timing.step_seconds = total / steps;
  });
  for (std::size_t r = 0; r < bubble.size(); ++r)
    timing.bubble += bubble[r] / stages, timing.forward += f[r] / stages, timing.backward += b[r] / stages,
        timing.weight += w[r] / stages;
  return timing;
}

/// Mean step time of the whole model on `ranks` threads as dp x tp (one rank: unsharded), the batch in
/// microbatches of one sequence accumulated.
template <class Plan>
double model_step_seconds(models::LlamaConfig const& c, int dp_size, int tp_size, int steps) {
  double seconds = 0;
  sw::run_threads(dp_size * tp_size, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, tp_size});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    models::Llama<float, Plan> model(c);
    sw::AdamW<float> optimizer({.learning_rate = 1e-3f, .max_grad_norm = 1.0f, .zero1 = dp_size > 1});
    sw::parallelize(model, tp);
    int const mine = batch_sequences / dp_size;
    Batch const batch(c, mine, dp.rank() * mine, mine);
    double total = 0;
    for (int step = 0; step <= steps; ++step) {
      sw::barrier(mesh);
      auto const start = clock_type::now();
      for (int m = 0; m < mine; ++m) {
        auto result = models::llama_loss(tp, model.forward(batch.ids[static_cast<std::size_t>(m)]),
                                         batch.targets[static_cast<std::size_t>(m)], c.vocabulary);
        result.dlogits.local /= float(mine);
        model.backward(result.dlogits);
      }
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      sw::barrier(mesh);
      if (step > 0) total += seconds_since(start);
    }
    if (world.rank() == 0) seconds = total / steps;
  });
  return seconds;
}

/// The schedule's bubble in theory: its tables' timeline (sw::schedule_timeline) at the measured F, B and W of one
/// microbatch through one chunk, equal on every stage, messages free.
template <class Schedule>
double theory(Timing const& t, int stages, int m) {
  return sw::schedule_timeline(Schedule{}, stages, m, {t.forward, t.backward, t.weight, 0}).bubble();
}

void time_schedules(models::LlamaConfig const& c, int steps, bool smoke) {
  std::printf("%-6s %-5s %4s %12s %12s %12s %24s\n", "stages", "sched", "m", "step (s)", "bubble", "theory",
              "F / B / W per microbatch (ms)");
  auto const row = [](int stages, char const* name, int m, Timing const& t, double theory) {
    std::printf("%-6d %-5s %4d %12.4f %12.3f %12.3f %8.1f /%6.1f /%6.1f\n", stages, name, m, t.step_seconds, t.bubble,
                theory, t.forward * 1e3, t.backward * 1e3, t.weight * 1e3);
    std::fflush(stdout);
  };
  for (int stages : {2, 4}) {
    if (smoke && stages == 4) break;
    for (int m : {1, 2, 4, 8}) {
      auto const gpipe = pipeline_timing<sw::GPipe>(c, stages, m, steps);
      row(stages, "gpipe", m, gpipe, theory<sw::GPipe>(gpipe, stages, m));
      auto const one = pipeline_timing<sw::OneFOneB>(c, stages, m, steps);
      row(stages, "1f1b", m, one, theory<sw::OneFOneB>(one, stages, m));
      auto const h1 = pipeline_timing<sw::ZeroBubbleH1>(c, stages, m, steps);
      row(stages, "zbh1", m, h1, theory<sw::ZeroBubbleH1>(h1, stages, m));
      if (c.layers % (2 * static_cast<std::size_t>(stages)) != 0) continue;  // ZBV: 2 x stages chunks
      auto const v = pipeline_timing<sw::ZeroBubbleV>(c, stages, m, steps);
      row(stages, "zbv", m, v, theory<sw::ZeroBubbleV>(v, stages, m));
      if (!sw::DualPipeV::supports(stages, m)) continue;  // DualPipeV: at least 2 x stages microbatches
      auto const dual = pipeline_timing<sw::DualPipeV>(c, stages, m, steps);
      // Its whole backwards count as B in its own timing: its table timed at ZBV's F, B and W (the same chunks).
      row(stages, "dualv", m, dual, theory<sw::DualPipeV>(v, stages, m));
    }
  }
}

/// The four layouts in turn, `rounds` times over (a slow spell of this shared machine then falls on each layout,
/// not on one); each layout's median over the rounds.
void compare_parallelisms(models::LlamaConfig const& c, int steps, int rounds) {
  double const tokens = double(batch_sequences) * double(c.sequence);
  std::vector<double> ones, pp2s, zbs, zbvs, duals, tp2s, dp2s;
  for (int r = 0; r < rounds; ++r) {
    ones.push_back(model_step_seconds<sw::serial_plan>(c, 1, 1, steps));
    pp2s.push_back(pipeline_timing<sw::OneFOneB>(c, 2, batch_sequences, steps).step_seconds);
    zbs.push_back(pipeline_timing<sw::ZeroBubbleH1>(c, 2, batch_sequences, steps).step_seconds);
    zbvs.push_back(pipeline_timing<sw::ZeroBubbleV>(c, 2, batch_sequences, steps).step_seconds);
    duals.push_back(pipeline_timing<sw::DualPipeV>(c, 2, batch_sequences, steps).step_seconds);
    tp2s.push_back(model_step_seconds<models::llama_plan<true>>(c, 1, 2, steps));
    dp2s.push_back(model_step_seconds<sw::serial_plan>(c, 2, 1, steps));
  }
  double const one = bench::median(ones), pp2 = bench::median(pp2s), zb = bench::median(zbs), zbv = bench::median(zbvs),
               dual = bench::median(duals), tp2 = bench::median(tp2s), dp2 = bench::median(dp2s);
  std::printf("\n# each layout's median step over %d rounds\n", rounds);
  namespace planner = sw::planner;
  planner::training_shape const shape{batch_sequences, c.sequence, planner::fp32};
  auto const planned = [&](planner::layout l) {
    return planner::estimate_layout(c, shape, l, predicted_machine).step_seconds;
  };
  double const core_peak = bench::measure_core_peaks().fp32, flops = bench::llama_training_flops(c, batch_sequences);
  std::printf("\n%-28s %12s %12s %14s %14s %12s %8s\n", "same model and batch", "tokens/s", "vs 1 rank", "step (s)",
              "planned (s)", "measured/planned", "MFU");
  auto const row = [&](char const* name, double seconds, double predicted) {
    int const ranks = std::strcmp(name, "one_rank") == 0 ? 1 : 2;
    std::printf("%-28s %12.0f %12.2f %14.4f %14.4f %12.3f %8.2f\n", name, tokens / seconds, one / seconds, seconds,
                predicted, seconds / predicted, bench::mfu(flops, seconds, ranks, core_peak));
    std::printf("RESULT %s %.1f\n", name, tokens / seconds);
  };
  auto const zero1 = planner::state_sharding::zero1;
  row("one_rank", one, planned({1, 1, 1, batch_sequences}));
  row("pp2_1f1b_m8", pp2, planned({1, 2, 1, batch_sequences}));
  row("pp2_zbh1_m8", zb, planned({1, 2, 1, batch_sequences}));  // the planner knows 1F1B's bubble only
  row("pp2_zbv_m8", zbv, planned({1, 2, 1, batch_sequences}));
  row("pp2_dualpipev_m8", dual, planned({1, 2, 1, batch_sequences}));
  row("tp2_sequence_parallel", tp2, planned({1, 1, 2, batch_sequences}));
  row("dp2_zero1", dp2, planned({2, 1, 1, batch_sequences / 2, zero1}));
}

/// A pipeline step with m = 8 on this process's stage, after a first one; prints the peak resident set it added.
int measure_memory(int argc, char** argv, std::string const& mode, models::LlamaConfig const& c) {
  sw::launch(argc, argv, 2, [&](auto& world) {
    auto const pp = sw::make_mesh<"pp">(world, {world.size()});
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    std::vector<models::LlamaStage<float>> stage;
    stage.emplace_back(c, sw::stage_split(c.layers, pp.size()), pp.rank());
    stage.front().checkpoint_blocks(mode == "1f1b-blocks");
    sw::zero_grad(stage.front());  // the gradients exist before the step: only activations are new
    Batch const batch(c, batch_sequences);
    auto const options =
        sw::pipeline_options{mode == "1f1b-recompute" ? sw::stage_activations::recompute : sw::stage_activations::keep};
    auto const step = [&](auto schedule) {
      sw::run_pipeline_step(
          schedule, pp, std::span(stage), batch_sequences,
          [&](int m) { return std::span<const std::int64_t>(batch.ids[static_cast<std::size_t>(m)]); },
          [&](int m, auto const& h) {
            return stage.back().head_loss(tp, h, batch.targets[static_cast<std::size_t>(m)], 0.125f).gradient;
          },
          options);
    };
    auto const run = [&] {
      if (mode == "gpipe")
        step(sw::GPipe{});
      else
        step(sw::OneFOneB{});
    };
    run();  // a first step: BLAS's buffers are mapped, and the gradients allocated, as every later step finds them
    sw::zero_grad(stage.front());
    malloc_trim(0);  // what the first step freed goes back to the kernel: the resident set is what is held
    if (!bench::reset_peak()) std::printf("# this kernel cannot reset VmHWM: the peak below may predate the step\n");
    double const before = bench::status_mib("VmRSS");
    run();
    double const peak = bench::status_mib("VmHWM");
    namespace planner = sw::planner;  // what `shardwise plan` predicts for the busiest stage (1F1B) beyond its state
    planner::layout const l{1,
                            static_cast<std::size_t>(pp.size()),
                            1,
                            batch_sequences,
                            planner::state_sharding::replicated,
                            mode == "1f1b-blocks"};
    auto const e = planner::estimate_layout(c, {batch_sequences, c.sequence, planner::fp32}, l, {});
    double const mib = 1024.0 * 1024.0, planned = double(e.activation_bytes + e.working_bytes) / mib;
    std::printf(
        "RESULT memory %s stage %d of %d: %.1f MiB above the %.1f MiB held before the step (shardwise plan, 1F1B: "
        "%.1f MiB on the busiest stage: %.1f of activations, %.1f of a backward's transients; measured / planned "
        "%.3f)\n",
        mode.c_str(), pp.rank(), pp.size(), peak - before, before, planned, double(e.activation_bytes) / mib,
        double(e.working_bytes) / mib, (peak - before) / planned);
  });
  return 0;
}

/// FSDP within the stages: dp 2 x pp 2 (full shard, a unit per block), 1F1B over each dp rank's 4 sequences as 4
/// microbatches; each rank's peak resident set during a step above what it held before (its shards, their
/// gradients and AdamW's moments), against the planner's figure for the busiest stage beyond the sharded state.
int measure_sharded_memory(int argc, char** argv, models::LlamaConfig const& c) {
  sw::launch(argc, argv, 4, [&](auto& world) {
    if (world.size() != 4) {
      std::printf("# memory fsdp-1f1b runs dp 2 x pp 2: start it under mpiexec -n 4\n");
      return;
    }
    auto const mesh = sw::make_mesh<"dp", "pp">(world, {2, 2});
    auto const pp = sw::submesh<"pp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    sw::stage_chunks<models::LlamaStage<float>> stage;
    stage.emplace_back(c, sw::stage_split(c.layers, pp.size()), pp.rank());
    auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(stage, dp);
    sw::AdamW<float> optimizer({.learning_rate = 1e-4f});
    int const micro = batch_sequences / 2;  // this dp rank's half of the batch, a sequence per microbatch
    Batch const batch(c, micro, dp.rank() * micro, micro);
    auto const step = [&] {
      sw::run_pipeline_step(
          sw::OneFOneB{}, pp, sharded, micro,
          [&](int m) { return std::span<const std::int64_t>(batch.ids[static_cast<std::size_t>(m)]); },
          [&](int m, auto const& h) {
            return stage.back().head_loss(tp, h, batch.targets[static_cast<std::size_t>(m)], 0.25f).gradient;
          });
    };
    step();  // a first step and the optimizer's: its moments exist, as every later step finds them
    optimizer.step(sharded, pp);
    sw::zero_grad(sharded);
    malloc_trim(0);
    if (!bench::reset_peak()) std::printf("# this kernel cannot reset VmHWM: the peak below may predate the step\n");
    double const before = bench::status_mib("VmRSS");
    step();
    double const peak = bench::status_mib("VmHWM");
    namespace planner = sw::planner;
    planner::layout const l{2, 2, 1, static_cast<std::size_t>(micro), planner::state_sharding::fsdp, false};
    auto const e = planner::estimate_layout(c, {batch_sequences, c.sequence, planner::fp32}, l, {});
    std::size_t const sharded_state = planner::model_state_bytes(e.parameters, 2, l.sharding, planner::fp32);
    double const mib = 1024.0 * 1024.0, planned = double(e.bytes_per_rank() - sharded_state) / mib;
    std::printf(
        "RESULT memory fsdp-1f1b dp %d stage %d of %d: %.1f MiB above the %.1f MiB held before the step (shardwise "
        "plan, FSDP x PP: %.1f MiB on the busiest stage beyond its shards: %.1f gathered with gradients, %.1f of "
        "activations, %.1f of a backward's transients; measured / planned %.3f)\n",
        dp.rank(), pp.rank(), pp.size(), peak - before, before, planned, double(e.state_bytes - sharded_state) / mib,
        double(e.activation_bytes) / mib, double(e.working_bytes) / mib, (peak - before) / planned);
  });
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  openblas_set_num_threads(1);  // one thread per rank, BLAS included
  int steps = 3, rounds = 3;
  bool small = false, smoke = false, compare_only = false;
  std::string memory_mode;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--small")) small = true;
    if (!std::strcmp(argv[i], "--smoke")) smoke = true, small = true, steps = 1;
    if (!std::strcmp(argv[i], "--compare-only")) compare_only = true;
    if (!std::strcmp(argv[i], "memory") && i + 1 < argc) memory_mode = argv[++i];
    if (!std::strcmp(argv[i], "--machine") && i + 1 < argc) predicted_machine = machine_from_flag(argv[++i]);
  }
  rounds = std::max(rounds, 1), steps = std::max(steps, 1);
  auto const c = config(small);
  if (memory_mode == "fsdp-1f1b") return measure_sharded_memory(argc, argv, c);
  if (!memory_mode.empty()) return measure_memory(argc, argv, memory_mode, c);
  std::printf("# Llama dim %zu, %zu layers, hidden %zu, %d sequences of %zu tokens per step; thread mesh\n", c.dim,
              c.layers, c.hidden, batch_sequences, c.sequence);
  if (!compare_only) time_schedules(c, steps, smoke);
  compare_parallelisms(c, steps, smoke ? 1 : rounds);
  return 0;
}
