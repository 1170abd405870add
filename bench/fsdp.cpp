// FSDP on the Llama model, in one run:
//  - tokens/s at dp 2 (the thread mesh) of full shard, shard-grad-op and no-shard, beside plain data
//    parallelism (AdamW over dp, the gradients all-reduced at the step) and one rank, on the same model and batch;
//  - with `memory`, under mpiexec (one process per rank, full shard at dp = the world): what each rank holds
//    between steps — parameter, gradient and optimizer-state shards — against the ideal (the unsharded total / dp),
//    the largest unit gathered, and the peak resident set during the steps above the process's size before them.
//
//  - with `prefetch`, under mpiexec -n 2 (one process per rank, where MPI_Iallgatherv can move a unit while
//    the rank computes): full shard, shard-grad-op and no-shard with and without forward and backward prefetch,
//    alternating, medians over rounds.
//
//   bench_fsdp [--steps 5] [--rounds 3] [--small] [--smoke] [--machine FILE|calibrate] [--only "full shard"]
//   mpiexec -n 4 bench_fsdp memory [--small]
//   mpiexec -n 2 bench_fsdp prefetch [--small] [--rounds 3]
//   mpiexec -n 4 bench_fsdp load [--small] [--dir D] [--tp 2]
//
//  - with `load`, under mpiexec (full shard at dp = the world / tp; with --tp, FSDP x TP): each rank's peak resident
//    set while loading a consolidated model.safetensors, every rank reading its rows against only_rank0_reads,
//    against its shard plus the largest tensor.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/planner/llama.hpp>
#include <shardwise/planner/machine_file.hpp>
#include <shardwise/shardwise.hpp>
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

constexpr int batch_sequences = 4;  // per step, over every dp rank

models::LlamaConfig config(bool small) {
  models::LlamaConfig c;
  if (small) {  // the tests' size
    c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 4, c.hidden = 64, c.sequence = 8;
  } else {
    c.vocabulary = 8192, c.dim = 1024, c.layers = 4, c.heads = 16, c.kv_heads = 8, c.hidden = 2816, c.sequence = 128;
  }
  return c;
}

/// This dp rank's sequences of the step's batch: ids and targets.
void batch(models::LlamaConfig const& c, int rank, int ranks, std::vector<std::int64_t>& ids,
           std::vector<std::int64_t>& targets) {
  ids.clear(), targets.clear();
  int const per = batch_sequences / ranks;
  for (int b = rank * per; b < (rank + 1) * per; ++b)
    for (std::size_t t = 0; t < c.sequence; ++t) {
      ids.push_back(static_cast<std::int64_t>((b * 131 + t * 17) % c.vocabulary));
      targets.push_back(static_cast<std::int64_t>((b * 131 + t * 17 + 1) % c.vocabulary));
    }
}

enum class mode { one_rank, data_parallel, no_shard, shard_grad_op, full_shard, full_shard_bf16, full_shard_prefetch };
char const* name_of(mode m) {
  constexpr char const* names[] = {"one rank",
                                   "dp 2, AdamW over dp (DDP-like)",
                                   "dp 2, FSDP no-shard",
                                   "dp 2, FSDP shard-grad-op",
                                   "dp 2, FSDP full shard",
                                   "dp 2, FSDP full shard, bf16 gathers (mixed_precision<bfloat16, float>)",
                                   "dp 2, FSDP full shard, forward and backward prefetch"};
  return names[static_cast<int>(m)];
}

/// Median step time (forward, loss, backward, optimizer) over `steps` after one warm-up step.
template <class Step, class World>
double time_steps(World const& world, int steps, Step&& step) {
  std::vector<double> times;
  for (int s = 0; s <= steps; ++s) {
    world.barrier();
    auto const start = clock_type::now();
    step();
    world.barrier();
    if (s > 0) times.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
  }
  return bench::median(times);
}

template <class Strategy, class Precision = sw::full_precision, class World>
double time_fsdp(World const& world, models::LlamaConfig const& c, int steps, bool prefetch = false) {
  auto const dp = sw::make_mesh<"dp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<float> model(c);
  auto sharded = sw::fully_shard<sw::fsdp_policy<Strategy, sw::wrap_paths<"layers.*">, Precision>>(
      model, dp, {.forward_prefetch = prefetch, .backward_prefetch = prefetch});
  sw::AdamW<float> optimizer({.learning_rate = 1e-3f, .max_grad_norm = 1.0f});
  std::vector<std::int64_t> ids, targets;
  batch(c, dp.rank(), dp.size(), ids, targets);
  return time_steps(world, steps, [&] {
    auto const logits = sharded.forward(ids);
    auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
    sharded.backward(result.dlogits);
    optimizer.step(sharded);
    sw::zero_grad(sharded);
  });
}

/// Median time of gathering every unit once (sharded.unshard(), fp32, collective) and freeing it: what a full
/// shard step moves twice (forward and backward), the most prefetching could hide.
template <class World>
double time_gathers(World const& world, models::LlamaConfig const& c, int steps) {
  auto const dp = sw::make_mesh<"dp">(world, {world.size()});
  models::Llama<float> model(c);
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
  return time_steps(world, steps, [&] {
    sharded.unshard();
    sharded.reshard();
  });
}

template <class World>
double time_plain(World const& world, models::LlamaConfig const& c, int steps) {
  auto const dp = sw::make_mesh<"dp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<float> model(c);
  sw::AdamW<float> optimizer({.learning_rate = 1e-3f, .max_grad_norm = 1.0f});
  std::vector<std::int64_t> ids, targets;
  batch(c, dp.rank(), dp.size(), ids, targets);
  return time_steps(world, steps, [&] {
    auto const logits = model.forward(ids);
    auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
    model.backward(result.dlogits);
    optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
  });
}

/// The machine the predictions are for: the built-in one, `--machine FILE` (bench_machine's output from the
/// same session: this machine's speed moves between days by more than the predictions' target), or `--machine
/// calibrate` (measured in this process at its start: machine_flag.hpp).
sw::planner::machine predicted_machine;

/// The step time `shardwise plan` predicts for a mode (shardwise::planner, fp32, predicted_machine);
/// 0 for the modes it does not model (shard-grad-op, bf16 gathers).
double planned_seconds(models::LlamaConfig const& c, mode m) {
  namespace planner = sw::planner;
  planner::training_shape const shape{batch_sequences, c.sequence, planner::fp32};
  auto const at = [&](std::size_t dp, planner::state_sharding s) {
    return planner::estimate_layout(c, shape, planner::layout{dp, 1, 1, 1, s}, predicted_machine).step_seconds;
  };
  switch (m) {
    case mode::one_rank:
      return at(1, planner::state_sharding::replicated);
    case mode::data_parallel:
    case mode::no_shard:
      return at(2, planner::state_sharding::replicated);
    case mode::full_shard:
    case mode::full_shard_prefetch:
      return at(2, planner::state_sharding::fsdp);
    default:
      return 0;
  }
}

/// One mode's median step time on the thread mesh (rank 0's).
double time_mode(models::LlamaConfig const& c, mode m, int steps) {
  double seconds = 0;
  sw::run_threads(m == mode::one_rank ? 1 : 2, [&](auto& world) {
    double t = 0;
    switch (m) {
      case mode::one_rank:
      case mode::data_parallel:
        t = time_plain(world, c, steps);
        break;
      case mode::no_shard:
        t = time_fsdp<sw::no_shard>(world, c, steps);
        break;
      case mode::shard_grad_op:
        t = time_fsdp<sw::shard_grad_op>(world, c, steps);
        break;
      case mode::full_shard:
        t = time_fsdp<sw::full_shard>(world, c, steps);
        break;
      case mode::full_shard_bf16:
        t = time_fsdp<sw::full_shard, sw::mixed_precision<Eigen::bfloat16, float>>(world, c, steps);
        break;
      case mode::full_shard_prefetch:
        t = time_fsdp<sw::full_shard>(world, c, steps, true);
        break;
    }
    if (world.rank() == 0) seconds = t;
  });
  return seconds;
}

/// Every mode in turn, `rounds` times over (a slow spell of this shared machine then falls on every mode, not on
/// one); each mode's median over the rounds.
void speed(models::LlamaConfig const& c, int steps, int rounds, bool small, std::string const& only) {
  std::printf(
      "# tokens/s, Llama dim %zu, %zu layers, vocabulary %zu, %d x %zu tokens a step, fp32, thread mesh, median of "
      "%d rounds\n",
      c.dim, c.layers, c.vocabulary, batch_sequences, c.sequence, rounds);
  std::printf(
      "| setup | step (ms) | tokens/s | vs dp 2 without FSDP | planned (ms) | measured / planned | MFU |\n"
      "|---|---|---|---|---|---|---|\n");
  constexpr mode modes[] = {mode::one_rank,   mode::data_parallel,   mode::no_shard,           mode::shard_grad_op,
                            mode::full_shard, mode::full_shard_bf16, mode::full_shard_prefetch};
  std::vector<std::vector<double>> times(std::size(modes));
  auto const chosen = [&](mode m) { return std::string(name_of(m)).find(only) != std::string::npos; };
  if (std::none_of(std::begin(modes), std::end(modes), chosen))
    std::printf("# --only \"%s\" names no mode: see the setups in the table's first column\n", only.c_str());
  for (int r = 0; r < rounds; ++r)
    for (std::size_t i = 0; i < std::size(modes); ++i)
      if (chosen(modes[i])) times[i].push_back(time_mode(c, modes[i], steps));
  double const tokens = double(batch_sequences) * double(c.sequence);
  double const core_peak = bench::measure_core_peaks().fp32, flops = bench::llama_training_flops(c, batch_sequences);
  double plain = 0, full_step = 0;
  for (std::size_t i = 0; i < std::size(modes); ++i) {
    mode const m = modes[i];
    if (!chosen(m)) continue;
    double const seconds = bench::median(times[i]);
    if (m == mode::data_parallel) plain = seconds;
    if (m == mode::full_shard) full_step = seconds;
    double const predicted = planned_seconds(c, m);
    std::printf("| %s | %.1f | %.0f | %s | %s | %s | %.2f |\n", name_of(m), seconds * 1e3, tokens / seconds,
                m == mode::one_rank || plain == 0 ? "" : std::to_string(plain / seconds).substr(0, 4).c_str(),
                predicted > 0 ? std::to_string(predicted * 1e3).substr(0, 6).c_str() : "",
                predicted > 0 ? std::to_string(seconds / predicted).substr(0, 5).c_str() : "",
                bench::mfu(flops, seconds, m == mode::one_rank ? 1 : 2, core_peak));
    std::printf("RESULT %s %d %.1f\n", small ? "small" : "large", static_cast<int>(m), tokens / seconds);
  }
  if (full_step == 0) return;
  double gathers = 0;
  sw::run_threads(2, [&](auto& world) {
    double const t = time_gathers(world, c, steps);
    if (world.rank() == 0) gathers = t;
  });
  std::printf(
      "\nfull shard at dp 2 gathers every unit twice a step: 2 x %.1f ms = %.0f%% of its %.1f ms step; "
      "with both cores computing, that copy has no idle core to run on, so prefetching could hide at most "
      "the wait for the slower rank, not the copy\n",
      gathers * 1e3, 200 * gathers / full_step, full_step * 1e3);
}

/// Under mpiexec: each rank's held bytes and peak resident set during two steps of full shard at dp = world.
template <class World>
void memory(World const& world, models::LlamaConfig const& c) {
  double const before = bench::status_mib("VmRSS");
  auto const dp = sw::make_mesh<"dp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<float> model(c);
  std::size_t total = 0;
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { total += std::size_t(p.value->size()); });
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
  std::size_t largest_unit = 0;
  {
    models::Llama<float> whole(c);  // the units' sizes, counted on a model of the same config
    std::size_t root = 0, block = 0;
    sw::for_each_parameter(whole, [&](std::string const& name, auto const& p) {
      (name.rfind("layers.0.", 0) == 0 ? block
       : name.rfind("layers.", 0) == 0 ? largest_unit
                                       : root) += std::size_t(p.value->size());
    });
    largest_unit = std::max(root, block);
  }
  sw::AdamW<float> optimizer({.learning_rate = 1e-3f, .max_grad_norm = 1.0f});
  std::vector<std::int64_t> ids, targets;
  batch(c, dp.rank(), dp.size(), ids, targets);
  auto step = [&] {
    auto const logits = sharded.forward(ids);
    auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
    sharded.backward(result.dlogits);
    optimizer.step(sharded);
    sw::zero_grad(sharded);
  };
  step();  // the optimizer's state exists from here
  double const steady = bench::status_mib("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";  // the peak resident set starts again from now
  step();
  double const peak = bench::status_mib("VmHWM");
  double const mib = 1024.0 * 1024.0;
  double const held = double(sharded.held_elements() + optimizer.state_elements()) * sizeof(float) / mib;
  double const ideal = double(total) * 4 * sizeof(float) / double(world.size()) / mib;  // values, grads, m, v
  namespace planner = sw::planner;  // what `shardwise plan` predicts this rank holds at its peak
  auto const dp_size = static_cast<std::size_t>(world.size());
  double const planned = double(planner::estimate_layout(c, {batch_sequences, c.sequence, planner::fp32},
                                                         {dp_size, 1, 1, 1, planner::state_sharding::fsdp}, {})
                                    .bytes_per_rank()) /
                         mib;
  char line[512];
  std::snprintf(line, sizeof line, "| %d | %d | %.1f | %.1f | %.3f | %.1f | %.1f | %.1f | %.1f | %.3f |", world.size(),
                world.rank(), held, ideal, held / ideal, double(largest_unit) * sizeof(float) / mib, steady - before,
                peak - before, planned, (peak - before) / planned);
  for (int r = 0; r < world.size(); ++r) {
    world.barrier();
    if (r == world.rank()) std::printf("%s\n", line), std::fflush(stdout);
  }
}

/// Calls fn(sharded, tp...) on `model` fully sharded at dp = world / tp_size: over the 1-D dp mesh at tp 1 (no tp
/// argument), else over the dp x tp mesh with llama_plan's tensor parallelism (fn also gets the tp mesh).
template <class World, class Model, class Fn>
void sharded_at(World const& world, int tp_size, Model& model, Fn&& fn) {
  using policy = sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>;
  if (tp_size == 1) {
    auto sharded = sw::fully_shard<policy>(model, sw::make_mesh<"dp">(world, {world.size()}));
    fn(sharded);
  } else {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {world.size() / tp_size, tp_size});
    auto sharded = sw::fully_shard<policy>(model, mesh);
    fn(sharded, sw::submesh<"tp">(mesh));
  }
}

/// Prints one table row per rank, in rank order.
template <class World>
void print_by_rank(World const& world, char const* line) {
  for (int r = 0; r < world.size(); ++r) {
    world.barrier();
    if (r == world.rank()) std::printf("%s\n", line), std::fflush(stdout);
  }
}

/// Under mpiexec: a model saved and consolidated (then freed), full shard at dp = world / tp of the same model
/// declared with sw::Lazy (each rank's resident set after the model, above its start, and the peak of sharding
/// it), then the loads of the consolidated file, every rank reading its rows and with only_rank0_reads (rank 0
/// reads and sends each rank its shards: Accelerate's fsdp2_load_full_state_dict), alternating, twice: each
/// rank's peak resident set during the load above its size before it, against its shard plus the largest tensor.
template <class Plan, class World>
void load_memory(World const& world, models::LlamaConfig const& c, std::filesystem::path const& dir, int tp_size) {
  std::filesystem::path const file = dir / "model.safetensors";
  double const start_rss = bench::status_mib("VmRSS"), mib = 1024.0 * 1024.0;
  {
    models::Llama<float, Plan> model(c);
    sharded_at(world, tp_size, model,
               [&](auto& sharded, auto const&... tp) { sw::save_sharded(sharded, tp..., dir / "ckpt", 0); });
    if (world.rank() == 0) sw::consolidate(dir / "ckpt", file);
    world.barrier();
  }
  double largest = 0;  // MiB: what rank 0 holds of one tensor while it sends its pieces
  for (auto const& t : sw::safetensors_file(file.string()).tensors())
    largest = std::max(largest, double(t.bytes()) / mib);
  // Declared with sw::Lazy: no rank ever holds the whole model; the loads below fill the shards.
  double const lazy_before = bench::status_mib("VmRSS");
  std::ofstream("/proc/self/clear_refs") << "5";
  sw::Lazy<models::Llama<float, Plan>> lazy(c);
  sharded_at(world, tp_size, lazy, [&](auto& sharded, auto const&... tp) {
    double const lazy_peak = bench::status_mib("VmHWM") - lazy_before;
    double const shard = double(sharded.held_elements() / 2) * sizeof(float) / mib;
    char line[320];
    std::snprintf(line, sizeof line, "| sw::Lazy, fully_shard | %d x %d | %d | %.1f | %.1f | %.1f | %.1f | | |",
                  world.size() / tp_size, tp_size, world.rank(), shard, largest, lazy_before - start_rss, lazy_peak);
    print_by_rank(world, line);
    for (int round = 0; round < 2; ++round)
      for (bool const rank0 : {false, true}) {
        world.barrier();
        double const before = bench::status_mib("VmRSS");
        std::ofstream("/proc/self/clear_refs") << "5";  // the peak resident set starts again from now
        auto const start = clock_type::now();
        (void)sw::load_consolidated(sharded, tp..., file, {}, {.only_rank0_reads = rank0});
        double const seconds = std::chrono::duration<double>(clock_type::now() - start).count();
        double const peak = bench::status_mib("VmHWM") - before;
        std::snprintf(line, sizeof line, "| %s | %d x %d | %d | %.1f | %.1f | %.1f | %.1f | %.3f | %.2f |",
                      rank0 ? "only_rank0_reads" : "every rank reads its rows", world.size() / tp_size, tp_size,
                      world.rank(), shard, largest, before - start_rss, peak, peak / (shard + largest), seconds);
        print_by_rank(world, line);
      }
  });
  world.barrier();
  if (world.rank() == 0) std::filesystem::remove_all(dir);
}

}  // namespace

/// Under mpiexec -n 2: each strategy's step with and without prefetch, alternating within each round (so drift
/// in the machine's speed falls on both), medians over the rounds.
template <class World>
void prefetch_gain(World const& world, models::LlamaConfig const& c, int steps, int rounds) {
  double const tokens = double(batch_sequences) * double(c.sequence);
  if (world.rank() == 0)
    std::printf(
        "# MPI, dp 2 (2 processes), Llama dim %zu, %zu layers, %d x %zu tokens a step, fp32; medians over %d "
        "rounds of %d steps\n| strategy | step without prefetch (ms) | with (ms) | tokens/s without | with | "
        "with / without |\n|---|---|---|---|---|---|\n",
        c.dim, c.layers, batch_sequences, c.sequence, rounds, steps);
  auto row = [&](char const* name, auto&& time) {
    std::vector<double> without, with;
    for (int r = 0; r < rounds; ++r) {
      without.push_back(time(false));
      with.push_back(time(true));
    }
    double const a = bench::median(without), b = bench::median(with);
    if (world.rank() == 0)
      std::printf("| %s | %.1f | %.1f | %.0f | %.0f | %.3f |\n", name, a * 1e3, b * 1e3, tokens / a, tokens / b, a / b),
          std::fflush(stdout);
  };
  row("full shard", [&](bool p) { return time_fsdp<sw::full_shard>(world, c, steps, p); });
  row("shard-grad-op", [&](bool p) { return time_fsdp<sw::shard_grad_op>(world, c, steps, p); });
  row("no-shard (nothing to gather)", [&](bool p) { return time_fsdp<sw::no_shard>(world, c, steps, p); });
}

int main(int argc, char** argv) {
  openblas_set_num_threads(1);  // one BLAS thread per rank: the ranks are the parallelism
  bool small = false, smoke = false, memory_mode = false, prefetch_mode = false, load_mode = false;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "shardwise_bench_fsdp_load";
  int steps = 5, rounds = 3, tp = 1;
  std::string only;  // the modes whose name holds it (e.g. "full shard"), to profile one
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--small")) small = true;
    if (!std::strcmp(argv[i], "--smoke")) smoke = small = true;
    if (!std::strcmp(argv[i], "memory")) memory_mode = true;
    if (!std::strcmp(argv[i], "prefetch")) prefetch_mode = true;
    if (!std::strcmp(argv[i], "load")) load_mode = true;
    if (!std::strcmp(argv[i], "--dir") && i + 1 < argc) dir = argv[++i];
    if (!std::strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--tp") && i + 1 < argc) tp = std::max(1, std::atoi(argv[++i]));
    if (!std::strcmp(argv[i], "--steps") && i + 1 < argc) steps = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[++i];
    if (!std::strcmp(argv[i], "--machine") && i + 1 < argc) predicted_machine = machine_from_flag(argv[++i]);
  }
  if (smoke) steps = 1;
  rounds = std::max(rounds, 1), steps = std::max(steps, 1);
  auto const c = config(small);
  if (memory_mode) {
    sw::launch(argc, argv, 2, [&](auto& world) { memory(world, c); });
    return 0;
  }
  if (load_mode) {
    sw::launch(argc, argv, 2, [&](auto& world) {
      if (tp == 1)
        load_memory<sw::serial_plan>(world, c, dir, 1);
      else
        load_memory<models::llama_plan<false>>(world, c, dir, tp);
    });
    return 0;
  }
  if (prefetch_mode) {
    sw::launch(argc, argv, 2, [&](auto& world) { prefetch_gain(world, c, steps, smoke ? 1 : rounds); });
    return 0;
  }
  speed(c, steps, smoke ? 1 : rounds, small, only);
  return 0;
}
