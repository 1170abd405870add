// A mixture-of-experts training run as a user's program does it, on N thread ranks that are the data-parallel
// ranks, each training its own rows of the batch: load a Mixtral save_pretrained folder (sw::Lazy +
// load_pretrained), place the experts over the ranks (--ep) or keep every expert on every rank, train steps of
// AdamW on the cross-entropy plus the router's load-balancing loss, save the model with its optimizer state, and
// load that back into a fresh model placed the same way. --dense runs a dense Llama folder the same way (no
// placing). Prints the median step's tokens/s (the whole batch's), the seconds of the load, the save and the
// reload, and the process's peak resident set (VmHWM) per rank. One run per process (run_moe.sh starts each);
// torch_moe.py does the same with transformers and torch.
//
// --exchange times instead sw::all_to_all_rows as the experts' dispatch uses it (each rank's rows x top_k routed
// evenly over the ranks, dim columns, in float) against the floor of the thread mesh: every rank copying the same
// bytes with memcpy at once.
//
//   bench_moe --folder DIR [--ep] [--dense] [--ranks N] [--steps N] [--sequences N] [--out DIR]
//   bench_moe --exchange --ranks N [--rows N] [--dim N]
//   bench_moe --smoke
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "median.hpp"
#include "mfu.hpp"
#include "proc_status.hpp"

extern "C" void openblas_set_num_threads(int);

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

struct options {
  fs::path folder, out = fs::temp_directory_path() / "shardwise-bench-moe";
  bool ep = false, dense = false, exchange = false, smoke = false;
  int ranks = 2, steps = 5, sequences = 4, rows = 512, dim = 1024;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

/// Rank `rank`'s share of the batch both programs train on: sequences / ranks rows of the config's length, ids and
/// next-token targets from one formula (torch_moe.py's).
void batch(models::LlamaConfig const& c, int sequences, int ranks, int rank, std::vector<std::int64_t>& ids,
           std::vector<std::int64_t>& targets) {
  int const per_rank = sequences / ranks;
  for (int b = rank * per_rank; b < (rank + 1) * per_rank; ++b)
    for (std::size_t t = 0; t < c.sequence; ++t) {
      ids.push_back(std::int64_t((std::size_t(b) * 131 + t * 17) % c.vocabulary));
      targets.push_back(std::int64_t((std::size_t(b) * 131 + (t + 1) * 17) % c.vocabulary));
    }
}

/// Load, place, steps, save, reload on `o.ranks` thread ranks; rank 0 prints the results.
template <class Model>
void train(options const& o) {
  double const rss_before = bench::status_mib("VmRSS");
  sw::run_threads(o.ranks, [&](auto& world) {
    openblas_set_num_threads(1);
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    auto const dp = sw::make_mesh<"dp">(world, {world.size()});
    auto began = std::chrono::steady_clock::now();
    sw::Lazy<Model> lazy(models::read_llama_config(o.folder / "config.json"));
    sw::parallelize(lazy, tp);
    auto const mapping = o.dense ? sw::transformers_llama_mapping()
                                 : sw::transformers_llama_mapping(sw::transformers_experts_in(o.folder));
    Model& model = sw::load_pretrained(lazy, tp, o.folder, mapping);
    if (o.ep) (void)sw::expert_parallelize(model, dp);  // the others' experts freed
    double const load_seconds = seconds_since(began);
    models::LlamaConfig const& c = model.config();
    double const aux_coef = c.moe ? c.moe->router_aux_loss_coef : 0.0;
    sw::AdamW<float> optimizer({.learning_rate = 1e-4f, .weight_decay = 0.0f, .max_grad_norm = 1.0f});
    std::vector<std::int64_t> ids, targets;
    batch(c, o.sequences, world.size(), world.rank(), ids, targets);
    std::vector<double> times;
    for (int s = 0; s <= o.steps; ++s) {  // step 0 is warm-up
      sw::barrier(dp);
      began = std::chrono::steady_clock::now();
      auto const loss = models::llama_loss(tp, model.forward(ids), targets, c.vocabulary);
      if constexpr (Model::sparse) (void)(loss.loss + aux_coef * model.router_aux_loss());  // as a user reports it
      model.backward(loss.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      sw::barrier(dp);
      if (s) times.push_back(seconds_since(began));
    }
    double const peak = bench::status_mib("VmHWM");
    began = std::chrono::steady_clock::now();
    sw::save_sharded(model, optimizer, tp, dp, o.out, o.steps);
    double const save_seconds = seconds_since(began);
    began = std::chrono::steady_clock::now();
    sw::Lazy<Model> again(c);
    sw::parallelize(again, tp);
    if (o.ep) (void)sw::expert_parallelize(again, dp);  // then only this rank's experts are allocated
    sw::AdamW<float> resumed(optimizer.options());
    (void)sw::load_sharded(sw::materialize(again), resumed, tp, dp, o.out);
    double const reload_seconds = seconds_since(began);
    if (world.rank() != 0) return;
    double const tokens = double(o.sequences) * double(c.sequence);
    std::string const run = std::string(o.dense ? "dense" : "experts ") + (o.dense ? ""
                                                                           : o.ep  ? "placed"
                                                                                   : "on every rank");
    double const mfu = bench::mfu(bench::llama_training_flops(c, o.sequences), bench::median(times), o.ranks,
                                  bench::measure_core_peaks().fp32);
    std::printf("| shardwise %s, %d ranks | %.0f | %.2f | %.2f | %.2f | %.0f | %.2f |\n", run.c_str(), o.ranks,
                tokens / bench::median(times), load_seconds, save_seconds, reload_seconds,
                (peak - rss_before) / o.ranks, mfu);
    std::printf("RESULT shardwise_%s_%d %.1f %.1f\n",
                o.dense ? "dense"
                : o.ep  ? "ep"
                        : "replicated",
                o.ranks, tokens / bench::median(times), (peak - rss_before) / o.ranks);
  });
}

/// The dispatch's exchange on o.ranks thread ranks against every rank copying the same bytes at once.
void exchange(options const& o) {
  sw::run_threads(o.ranks, [&](auto& world) {
    auto const ep = sw::make_mesh<"ep">(world, {world.size()});
    using matrix = sw::nn::matrix<float>;
    matrix const rows = matrix::Random(o.rows, o.dim);
    matrix received, copy(o.rows, o.dim);
    std::vector<std::size_t> const rows_to(std::size_t(world.size()), std::size_t(o.rows / world.size()));
    std::vector<double> exchange_times, copy_times;
    for (int repeat = 0; repeat < 21; ++repeat) {
      sw::barrier(ep);  // outside the timings: a barrier's wake-up is not the exchange's cost
      auto began = std::chrono::steady_clock::now();
      (void)sw::all_to_all_rows(ep, rows, rows_to, received);
      exchange_times.push_back(seconds_since(began));
      sw::barrier(ep);
      began = std::chrono::steady_clock::now();
      std::memcpy(copy.data(), rows.data(), sizeof(float) * std::size_t(rows.size()));
      copy_times.push_back(seconds_since(began));
    }
    if (world.rank() != 0) return;
    double const bytes = double(o.rows) * o.dim * sizeof(float), moved = bytes * (o.ranks - 1) / o.ranks;
    double const t = bench::median(exchange_times), floor = bench::median(copy_times);
    std::printf("| ep %d | %d x %d | %.2f | %.3f | %.2f | %.3f | %.2f |\n", o.ranks, o.rows, o.dim, bytes / (1 << 20),
                t * 1e3, moved / t / 1e9, floor * 1e3, t / floor);
    std::printf("RESULT exchange_%d %.6f %.6f\n", o.ranks, t, floor);
  });
}

/// The folders a --smoke run trains: a random toy Mixtral and a dense toy Llama, saved as transformers saves them.
void write_toy_folders(fs::path const& root) {
  models::LlamaConfig c{
      .vocabulary = 64, .dim = 32, .layers = 1, .heads = 4, .kv_heads = 2, .hidden = 64, .sequence = 16};
  auto const serial = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<float> dense(c);
  sw::save_sharded(dense, serial, root / "dense" / "sharded", 0);
  sw::consolidate(root / "dense" / "sharded", root / "dense" / "model.safetensors",
                  {.mapping = sw::transformers_llama_mapping()});
  models::write_llama_config(c, root / "dense" / "config.json");
  models::MoeConfig experts;
  experts.experts = 4, experts.top_k = 2, experts.expert_hidden = 24, experts.router_aux_loss_coef = 0.02;
  c.moe = experts, c.hidden = 24;  // Mixtral's config.json holds one width: intermediate_size, the experts'
  models::MoeLlama<float> sparse(c);
  sw::save_sharded(sparse, serial, root / "moe" / "sharded", 0);
  sw::consolidate(root / "moe" / "sharded", root / "moe" / "model.safetensors",
                  {.mapping = sw::transformers_llama_mapping(sw::transformers_experts::mixtral, 24)});
  models::write_llama_config(c, root / "moe" / "config.json");
}

options parse(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const flag = argv[i];
    if (flag == "--smoke" || flag == "--ep" || flag == "--dense" || flag == "--exchange") {
      (flag == "--smoke" ? o.smoke : flag == "--ep" ? o.ep : flag == "--dense" ? o.dense : o.exchange) = true;
      continue;
    }
    if (i + 1 >= argc) throw std::invalid_argument(flag + " needs a value");
    std::string const value = argv[++i];
    if (flag == "--folder")
      o.folder = value;
    else if (flag == "--ranks")
      o.ranks = std::stoi(value);
    else if (flag == "--steps")
      o.steps = std::stoi(value);
    else if (flag == "--sequences")
      o.sequences = std::stoi(value);
    else if (flag == "--rows")
      o.rows = std::stoi(value);
    else if (flag == "--dim")
      o.dim = std::stoi(value);
    else if (flag == "--out")
      o.out = value;
    else
      throw std::invalid_argument("unknown flag " + flag);
  }
  if (o.ranks < 1 || o.sequences % o.ranks != 0)
    throw std::invalid_argument("--ranks must divide --sequences (each rank trains its own rows)");
  return o;
}

void run(options const& o) {
  if (o.exchange)
    exchange(o);
  else if (o.dense)
    train<models::Llama<float>>(o);
  else
    train<models::MoeLlama<float>>(o);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    options o = parse(argc, argv);
    if (o.smoke) {
      fs::path const root = o.out / "toy";
      write_toy_folders(root);
      o.steps = 1, o.sequences = 2, o.ranks = 2;
      for (int mode = 0; mode < 3; ++mode) {
        o.dense = mode == 2, o.ep = mode == 1;
        o.folder = root / (o.dense ? "dense" : "moe");
        o.out = root / ("run" + std::to_string(mode));
        run(o);
      }
      o.exchange = true, o.rows = 8, o.dim = 4;
      run(o);
      return 0;
    }
    if (!o.exchange && o.folder.empty())
      throw std::invalid_argument("give --folder (torch_moe.py --write-folder writes one)");
    run(o);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "bench_moe: %s\n", e.what());
    return 1;
  }
  return 0;
}
