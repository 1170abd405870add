// Checkpoint benchmark (issue 5): save, load and consolidate throughput against plain `cp -r` of the same
// bytes in the same run, and the peak resident memory of each rank when a Llama of >= 1 GiB of fp32
// parameters is loaded lazily at TP 4, against the rank's shard.
//
//   bench_checkpoint throughput --dir D [--repeat N] [--smoke]
//       Thread mesh, one process. Creates the model at TP 4 without ever holding it whole (sw::Lazy,
//       sw::materialize, each rank fills its own shard deterministically), then times, side by side:
//       save_sharded at TP 4, `cp -r` of the checkpoint (and `cp -r` + `sync` of the copies, since the save
//       fsyncs), load_sharded at TP 4 and at TP 2 (resharding) into sw::Lazy models, sw::consolidate, `cp` of
//       the consolidated file — with the page cache warm, and cold (caches dropped before each timed step)
//       where /proc/sys/vm/drop_caches is writable. Leaves D/ckpt and D/consolidated/model.safetensors.
//
//   bench_checkpoint save --dir D [--repeat N] [--smoke]
//       Thread mesh, one process, the model at TP 4 as above (issue 16). Times, best of N each: the synchronous
//       save_sharded; `cp -r` + `sync` of its files; the floor of the same bytes (each rank's file written from
//       memory by plain write() in 64 MiB calls, then fsync, 4 threads at once); and the asynchronous save
//       through sw::async_save as the training thread sees it: the save_sharded call (copy of the shard), then
//       after a sleep of twice the synchronous save (training would run there), the poll() that finds every
//       rank's write finished and commits (any polls before it are counted too); and the floor of an
//       in-memory snapshot (the same bytes copied in memory by 4 threads with non-temporal stores). Then a
//       training step (forward + backward) alone, and one run while the asynchronous save's writes are in flight.
//       The first asynchronous save allocates its snapshot buffer; the later ones reuse it: both are shown.
//
//   mpiexec -n 4 bench_checkpoint rss --dir D --mode sharded|rank0|steps|consolidated [--smoke]
//       One MPI process per rank: sw::Lazy model, parallelize at TP 4, load (load_sharded; with
//       only_rank0_reads; with ranks_per_step = 1; or load_consolidated of the consolidated file), then
//       every rank's baseline (VmRSS before the model exists), peak (VmHWM) and shard bytes, printed by rank 0.
//
// --smoke: a tiny model, one repetition; proves the binary works (CTest bench_checkpoint.smoke).
#include <fcntl.h>
#include <sys/stat.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <shardwise/checkpoint/async_save.hpp>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/mesh/mpi/comm.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {

using Plan = models::llama_plan<false>;
using Model = models::Llama<float, Plan>;

models::LlamaConfig config(bool smoke) {
  models::LlamaConfig c;
  if (smoke) {
    c.vocabulary = 512, c.dim = 64, c.layers = 2, c.heads = 4, c.kv_heads = 4, c.hidden = 176, c.sequence = 8;
  } else {  // 388 M parameters: 1.55 GB (1.45 GiB) of fp32
    c.vocabulary = 32000, c.dim = 2048, c.layers = 5, c.heads = 16, c.kv_heads = 16, c.hidden = 5632;
    c.sequence = 16;
  }
  return c;
}

// A field of /proc/self/status in bytes (VmRSS: resident now, VmHWM: peak resident); 0 where there is none.
double status_bytes(char const* field) {
  std::ifstream status("/proc/self/status");
  std::string const key = std::string(field) + ":";
  for (std::string line; std::getline(status, line);)
    if (line.rfind(key, 0) == 0) return std::strtod(line.c_str() + key.size(), nullptr) * 1024.0;
  return 0;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::uint64_t bytes_under(fs::path const& p) {
  if (fs::is_regular_file(p)) return fs::file_size(p);
  std::uint64_t total = 0;
  for (auto const& e : fs::recursive_directory_iterator(p))
    if (e.is_regular_file()) total += e.file_size();
  return total;
}

std::string quoted(fs::path const& p) { return "'" + p.string() + "'"; }

void run(std::string const& command) {
  if (std::system(command.c_str()) != 0) {
    std::fprintf(stderr, "bench_checkpoint: \"%s\" failed\n", command.c_str());
    std::exit(1);
  }
}

// Writes back dirty pages and drops the page cache; false where this process may not.
bool drop_caches() {
  ::sync();
  std::FILE* f = std::fopen("/proc/sys/vm/drop_caches", "w");
  if (!f) return false;
  bool const ok = std::fputs("3\n", f) >= 0;
  return std::fclose(f) == 0 && ok;
}

std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Every parameter, through sw::for_each_parameter: it allocates no gradient, so what a load holds is measured
/// as the load left it.
template <class Fn>
void for_each_parameter_as_is(Model& model, Fn&& fn) {
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { fn(p); });
}

// Fills this rank's shard deterministically (values in [-0.5, 0.5)) and returns its sum. Replicated
// parameters (the norms) get the same values on every rank, as a model's would.
double fill_shard(Model& model, int rank) {
  double sum = 0;
  std::uint64_t parameter = 0;
  for_each_parameter_as_is(model, [&](auto const& p) {
    using P = std::remove_cvref_t<decltype(p)>;
    bool const sharded = sw::is_shard_v<typename P::grad_placement>;
    float* v = p.value->data();
    auto const n = static_cast<std::uint64_t>(p.value->size());
    std::uint64_t const seed = (std::uint64_t(sharded ? rank : 0) << 56) ^ (parameter++ << 40);
    for (std::uint64_t i = 0; i < n; ++i) {
      v[i] = float(splitmix(seed + i) >> 40) * 0x1p-24f - 0.5f;
      sum += v[i];
    }
  });
  return sum;
}

double shard_sum(Model& model) {
  double sum = 0;
  for_each_parameter_as_is(model, [&](auto const& p) {
    float const* v = p.value->data();
    for (Eigen::Index i = 0; i < p.value->size(); ++i) sum += v[i];
  });
  return sum;
}

struct Footprint {
  double parameters = 0, gradients = 0;  // bytes this rank holds: its parameter shard, the gradients allocated
};
Footprint footprint(Model& model) {
  Footprint f;
  for_each_parameter_as_is(model, [&](auto const& p) {
    f.parameters += double(p.value->size()) * sizeof(float);
    f.gradients += double(p.grad->size()) * sizeof(float);
  });
  return f;
}

struct Row {
  std::string what, cache;
  double bytes = 0, seconds = 0, cp_seconds = 0;
  std::string against;
};

void print_rows(std::vector<Row> const& rows) {
  std::printf("| operation | page cache | bytes | seconds | GB/s | cp | cp GB/s | ours / cp |\n");
  std::printf("|---|---|---:|---:|---:|---|---:|---:|\n");
  for (auto const& r : rows) {
    double const ours = r.bytes / r.seconds / 1e9, theirs = r.bytes / r.cp_seconds / 1e9;
    if (r.cp_seconds <= 0)
      std::printf("| %s | %s | %.0f MB | %.2f | %.2f | — | — | — |\n", r.what.c_str(), r.cache.c_str(), r.bytes / 1e6,
                  r.seconds, ours);
    else
      std::printf("| %s | %s | %.0f MB | %.2f | %.2f | %s | %.2f | %.2f |\n", r.what.c_str(), r.cache.c_str(),
                  r.bytes / 1e6, r.seconds, ours, r.against.c_str(), theirs, ours / theirs);
  }
  std::fflush(stdout);
}

int throughput(fs::path const& dir, int repeat, bool smoke) {
  auto const c = config(smoke);
  fs::create_directories(dir);
  fs::path const ckpt = dir / "ckpt", copy = dir / "ckpt_cp", consolidated = dir / "consolidated";
  fs::path const file = consolidated / "model.safetensors";
  fs::remove_all(ckpt), fs::remove_all(copy), fs::remove_all(consolidated);
  fs::create_directories(consolidated);
  bool const can_drop = drop_caches();
  std::printf(
      "bench_checkpoint: Llama vocabulary %zu, dim %zu, %zu layers, %zu heads, %zu kv heads, hidden %zu; "
      "folder %s; dropping the page cache %s\n",
      c.vocabulary, c.dim, c.layers, c.heads, c.kv_heads, c.hidden, dir.c_str(),
      can_drop ? "works (cold rows: caches dropped before each timed step)" : "is not permitted (warm only)");
  std::fflush(stdout);

  // Time one operation `repeat` times (the best is kept); `prepare` runs before each, untimed.
  auto best = [&](std::function<void()> const& prepare, std::function<double()> const& timed) {
    double t = 1e300;
    for (int i = 0; i < repeat; ++i) {
      prepare();
      t = std::min(t, timed());
    }
    return t;
  };
  auto timed_command = [](std::string const& command) {
    return [command] {
      auto const start = std::chrono::steady_clock::now();
      run(command);
      return seconds_since(start);
    };
  };

  // Create the model at TP 4, each rank its own shard, and save it (timed, between barriers, on rank 0).
  std::vector<double> created_sums(4), loaded_sums(4);
  double save_seconds = 1e300;
  sw::run_threads(4, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
    sw::Lazy<Model> lazy(c);
    sw::parallelize(lazy, tp);
    Model& model = sw::materialize(lazy);
    created_sums[std::size_t(world.rank())] = fill_shard(model, world.rank());
    for (int i = 0; i < repeat; ++i) {
      sw::barrier(tp);
      auto const start = std::chrono::steady_clock::now();
      sw::save_sharded(model, tp, ckpt, 100 + i, {{"bench", "checkpoint"}});
      sw::barrier(tp);
      if (world.rank() == 0) save_seconds = std::min(save_seconds, seconds_since(start));
    }
  });
  double const bytes = double(bytes_under(ckpt));
  std::printf("checkpoint: %.0f MB in %s (the model's fp32 parameters: %.3f GiB)\n", bytes / 1e6, ckpt.c_str(),
              bytes / double(1ull << 30));
  std::fflush(stdout);

  std::vector<Row> rows;
  auto const remove_copy = [&] { fs::remove_all(copy); };
  std::string const cp_ckpt = "cp -r " + quoted(ckpt) + " " + quoted(copy);
  // The save writes through the page cache and fsyncs every file: against cp alone and cp + sync of its files.
  double const cp_seconds = best(remove_copy, timed_command(cp_ckpt));
  double const cp_sync_seconds = best(
      remove_copy,
      timed_command(cp_ckpt + " && sync " + quoted(copy) + "/tensor_parallel_shards/*/* " + quoted(copy) + "/*.json"));
  rows.push_back({"save_sharded, TP 4 (4 threads), fsync", "source in memory", bytes, save_seconds, cp_sync_seconds,
                  "cp -r + sync, warm"});
  rows.push_back(
      {"save_sharded, TP 4 (4 threads), fsync", "source in memory", bytes, save_seconds, cp_seconds, "cp -r, warm"});

  // Loading into lazily declared models: each rank allocates and reads only its shard.
  auto load = [&](int ranks, bool check) {
    return [&, ranks, check] {
      double seconds = 0;
      sw::run_threads(ranks, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
        sw::Lazy<Model> lazy(c);
        sw::parallelize(lazy, tp);
        sw::barrier(tp);
        auto const start = std::chrono::steady_clock::now();
        Model& model = sw::load_sharded(lazy, tp, ckpt);
        sw::barrier(tp);
        if (world.rank() == 0) seconds = seconds_since(start);
        if (check) loaded_sums[std::size_t(world.rank())] = shard_sum(model);
      });
      return seconds;
    };
  };
  // What any loader into fresh memory pays before reading a byte: allocating and zeroing the shards
  // (sw::materialize allocates each layer's parameters, zeroed; gradients come on first use).
  auto allocate = [&](int ranks) {
    return [&, ranks] {
      double seconds = 0;
      sw::run_threads(ranks, [&](auto& world) {
        auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {ranks}));
        sw::Lazy<Model> lazy(c);
        sw::parallelize(lazy, tp);
        sw::barrier(tp);
        auto const start = std::chrono::steady_clock::now();
        (void)sw::materialize(lazy);
        sw::barrier(tp);
        if (world.rank() == 0) seconds = seconds_since(start);
      });
      return seconds;
    };
  };
  std::function<void()> const nothing = [] {};
  rows.push_back({"no I/O: sw::materialize of the lazy model, TP 4 (parameters, zeroed)", "—", bytes,
                  best(nothing, allocate(4)), 0, ""});
  rows.push_back({"no I/O: sw::materialize of the lazy model, TP 2", "—", bytes, best(nothing, allocate(2)), 0, ""});
  std::function<void()> const cold = [] { (void)drop_caches(); };
  std::function<void()> const cold_copy = [&] { remove_copy(), (void)drop_caches(); };
  std::function<void()> const warm_copy = remove_copy;
  auto const consolidate = [&] {
    auto const start = std::chrono::steady_clock::now();
    (void)sw::consolidate(ckpt, file);
    return seconds_since(start);
  };
  std::vector<std::string> const caches =
      can_drop ? std::vector<std::string>{"warm", "cold"} : std::vector<std::string>{"warm"};
  for (auto const& cache : caches) {
    bool const is_cold = cache == "cold";
    double const cp_read = best(is_cold ? cold_copy : warm_copy, timed_command(cp_ckpt));
    std::string const against = "cp -r, " + cache;
    rows.push_back({"load_sharded, TP 4 (4 threads), lazy", cache, bytes, best(is_cold ? cold : nothing, load(4, true)),
                    cp_read, against});
    rows.push_back({"load_sharded, TP 2 (2 threads), lazy, resharded", cache, bytes,
                    best(is_cold ? cold : nothing, load(2, false)), cp_read, against});
    // Consolidation writes a new file (atomically, fsync): against cp and cp + sync of the checkpoint.
    double const cp_read_sync =
        best(is_cold ? cold_copy : warm_copy,
             timed_command(cp_ckpt + " && sync " + quoted(copy) + "/tensor_parallel_shards/*/*"));
    rows.push_back({"consolidate (library call), fsync", cache, bytes,
                    best([&] { fs::remove(file), is_cold ? (void)drop_caches() : (void)0; }, consolidate), cp_read_sync,
                    "cp -r + sync, " + cache});
  }
  fs::remove_all(copy);
  for (int r = 0; r < 4; ++r)
    if (loaded_sums[std::size_t(r)] != created_sums[std::size_t(r)]) {
      std::fprintf(stderr, "bench_checkpoint: rank %d's shard loaded at TP 4 differs from the one saved\n", r);
      return 1;
    }
  std::printf("\nloaded at TP 4: every rank's shard sums to the saved one's (bit-identical sums)\n\n");
  print_rows(rows);
  return 0;
}

// The floor: `files` files of `bytes` each written at once from memory (one thread each, write() in 64 MiB
// calls, then fsync), the seconds until the last is on disk.
double write_fsync_floor(fs::path const& dir, std::vector<std::uint64_t> const& bytes) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::vector<std::vector<char>> data(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) data[i].assign(bytes[i], char(1 + i));  // resident before timing
  auto const start = std::chrono::steady_clock::now();
  std::vector<std::thread> writers;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    writers.emplace_back([&, i] {
      int const fd = ::open((dir / ("file" + std::to_string(i))).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      for (std::size_t at = 0; at < data[i].size();) {
        ssize_t const n = ::write(fd, data[i].data() + at, std::min<std::size_t>(data[i].size() - at, 64u << 20));
        if (n <= 0) std::abort();
        at += std::size_t(n);
      }
      if (::fsync(fd) != 0) std::abort();
      ::close(fd);
    });
  for (auto& w : writers) w.join();
  double const seconds = seconds_since(start);
  fs::remove_all(dir);
  return seconds;
}

// The floor of an in-memory snapshot: `bytes` copied by one thread each (as the ranks copy their shards), with
// non-temporal stores (SSE2) where the machine has them; the seconds until the last copy is done.
double copy_floor(std::vector<std::uint64_t> const& bytes) {
  std::vector<std::vector<char>> from(bytes.size()), to(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) from[i].assign(bytes[i], char(1)), to[i].assign(bytes[i], char(2));
  auto const start = std::chrono::steady_clock::now();
  std::vector<std::thread> copiers;
  for (std::size_t i = 0; i < bytes.size(); ++i)
    copiers.emplace_back([&, i] {
      char* out = to[i].data();
      char const* in = from[i].data();
      std::size_t n = bytes[i];
#if defined(__SSE2__)
      std::size_t const head = (16 - reinterpret_cast<std::uintptr_t>(out) % 16) % 16;
      std::memcpy(out, in, std::min(head, n));
      for (std::size_t at = head; at + 64 <= n; at += 64) {
        auto const* src = reinterpret_cast<__m128i const*>(in + at);
        auto* dst = reinterpret_cast<__m128i*>(out + at);
        __m128i const a = _mm_loadu_si128(src), b = _mm_loadu_si128(src + 1), c = _mm_loadu_si128(src + 2),
                      d = _mm_loadu_si128(src + 3);
        _mm_stream_si128(dst, a), _mm_stream_si128(dst + 1, b), _mm_stream_si128(dst + 2, c),
            _mm_stream_si128(dst + 3, d);
      }
      std::size_t const done = n < head ? n : head + (n - head) / 64 * 64;
      std::memcpy(out + done, in + done, n - done);
      _mm_sfence();
#else
      std::memcpy(out, in, n);
#endif
    });
  for (auto& c : copiers) c.join();
  return seconds_since(start);
}

int save(fs::path const& dir, int repeat, bool smoke) {
  auto const c = config(smoke);
  fs::create_directories(dir);
  fs::path const ckpt = dir / "ckpt", async_ckpt = dir / "ckpt_async", copy = dir / "ckpt_cp";
  fs::remove_all(ckpt), fs::remove_all(async_ckpt), fs::remove_all(copy);
  std::printf(
      "bench_checkpoint save: Llama vocabulary %zu, dim %zu, %zu layers, %zu heads, %zu kv heads, hidden %zu; "
      "TP 4 on 4 threads; folder %s; best of %d\n",
      c.vocabulary, c.dim, c.layers, c.heads, c.kv_heads, c.hidden, dir.c_str(), repeat);
  std::fflush(stdout);
  double step_alone = 1e300, step_during = 1e300;
  int writes_outlasting = 0;
  fs::path const fresh = dir / "ckpt_new";
  fs::remove_all(fresh);
  double replace_seconds = 1e300;
  double sync_seconds = 1e300, sync_seconds_all = 0, call_first = 0, call_best = 1e300, finish_best = 1e300,
         total_best = 1e300;
  int polls_best = 0;
  std::vector<double> created_sums(4), loaded_sums(4);
  sw::run_threads(4, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
    sw::Lazy<Model> lazy(c);
    sw::parallelize(lazy, tp);
    Model& model = sw::materialize(lazy);
    created_sums[std::size_t(world.rank())] = fill_shard(model, world.rank());
    sw::save_sharded(model, tp, ckpt, 99);  // so that every timed save into ckpt replaces one
    for (int i = 0; i < repeat; ++i) {
      sw::barrier(tp);
      auto const start = std::chrono::steady_clock::now();
      sw::save_sharded(model, tp, fresh, 100 + i, {{"bench", "checkpoint"}});  // into a new folder
      sw::barrier(tp);
      if (world.rank() == 0) sync_seconds = std::min(sync_seconds, seconds_since(start));
      if (world.rank() == 0) fs::remove_all(fresh), ::sync();
      sw::barrier(tp);
      auto const again = std::chrono::steady_clock::now();
      sw::save_sharded(model, tp, ckpt, 100 + i, {{"bench", "checkpoint"}});  // replacing the last one
      sw::barrier(tp);
      if (world.rank() == 0) replace_seconds = std::min(replace_seconds, seconds_since(again));
    }
    if (world.rank() == 0) sync_seconds_all = sync_seconds;
    sw::barrier(tp);
    sw::async_save saver;
    for (int i = 0; i < repeat + 1; ++i) {  // the first allocates the snapshot buffer; the others replace a save
      sw::barrier(tp);
      auto const start = std::chrono::steady_clock::now();
      sw::save_sharded(model, tp, async_ckpt, 200 + i, saver, {{"bench", "checkpoint"}});
      sw::barrier(tp);
      double const call = seconds_since(start);
      // Training would run here: the ranks sleep for twice the synchronous save, then poll (one all-reduce of a
      // flag; it commits if every rank's write has finished), and poll again until it has.
      std::this_thread::sleep_for(std::chrono::duration<double>(2 * sync_seconds_all));
      sw::barrier(tp);
      double polling = 0;
      int polls = 0;
      for (bool done = false; !done;) {
        auto const poll_start = std::chrono::steady_clock::now();
        done = saver.poll();
        polling += seconds_since(poll_start);
        if (++polls > 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      double const total = seconds_since(start) - 2 * sync_seconds_all;
      // Training again: the previous checkpoint's folder is removed meanwhile, by the saver's clean-up thread.
      std::this_thread::sleep_for(std::chrono::duration<double>(sync_seconds_all));
      if (world.rank() != 0) continue;
      if (i == 0) {
        call_first = call;
        continue;
      }
      if (call + polling < call_best + finish_best) call_best = call, finish_best = polling, polls_best = polls;
      total_best = std::min(total_best, total);
    }
    // A training step (forward and backward of 4 sequences) alone, and right after an asynchronous save's call,
    // while the ranks' background writes run; poll() after the step tells whether a write outlasted it.
    std::vector<std::int64_t> ids(4 * c.sequence), targets(ids.size());
    for (std::size_t t = 0; t < ids.size(); ++t) {
      ids[t] = std::int64_t((t * 37 + 5) % c.vocabulary);
      targets[t] = std::int64_t((t * 37 + 6) % c.vocabulary);
    }
    auto const train_step = [&] {
      auto const logits = model.forward(ids);
      auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
      model.backward(result.dlogits);
      sw::zero_grad(model);
    };
    train_step();  // allocates the gradients
    for (int i = 0; i < repeat; ++i) {
      sw::barrier(tp);
      auto const alone = std::chrono::steady_clock::now();
      train_step();
      sw::barrier(tp);
      if (world.rank() == 0) step_alone = std::min(step_alone, seconds_since(alone));
      sw::save_sharded(model, tp, async_ckpt, 300 + i, saver);
      sw::barrier(tp);
      auto const during = std::chrono::steady_clock::now();
      train_step();
      sw::barrier(tp);
      double const with = seconds_since(during);
      bool const outlasted = !saver.poll();
      saver.wait();
      if (world.rank() == 0) step_during = std::min(step_during, with), writes_outlasting += outlasted ? 1 : 0;
      std::this_thread::sleep_for(std::chrono::duration<double>(sync_seconds_all));  // the clean-up's time
    }
  });
  double const bytes = double(bytes_under(ckpt));
  // Loaded back: the asynchronous save's checkpoint holds the shards bit for bit.
  sw::run_threads(4, [&](auto& world) {
    auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
    sw::Lazy<Model> lazy(c);
    sw::parallelize(lazy, tp);
    loaded_sums[std::size_t(world.rank())] = shard_sum(sw::load_sharded(lazy, tp, async_ckpt));
  });
  for (int r = 0; r < 4; ++r)
    if (loaded_sums[std::size_t(r)] != created_sums[std::size_t(r)]) {
      std::fprintf(stderr, "bench_checkpoint: rank %d's shard loaded from the asynchronous save differs\n", r);
      return 1;
    }
  std::string const cp_ckpt = "cp -r " + quoted(ckpt) + " " + quoted(copy);
  double cp_sync = 1e300, rm_cp_sync = 1e300, floor = 1e300;
  std::string const sync_copy = " && sync " + quoted(copy) + "/tensor_parallel_shards/*/* " + quoted(copy) + "/*.json";
  for (int i = 0; i < repeat; ++i) {
    fs::remove_all(copy);
    ::sync();
    auto const start = std::chrono::steady_clock::now();
    run(cp_ckpt + sync_copy);
    cp_sync = std::min(cp_sync, seconds_since(start));
    auto const again = std::chrono::steady_clock::now();  // the copy replaced as a save replaces a checkpoint
    run("rm -rf " + quoted(copy) + " && " + cp_ckpt + sync_copy);
    rm_cp_sync = std::min(rm_cp_sync, seconds_since(again));
  }
  fs::remove_all(copy);
  std::vector<std::uint64_t> rank_bytes;
  for (int r = 0; r < 4; ++r) rank_bytes.push_back(fs::file_size(ckpt / sw::rank_folder(r, 0) / "model.safetensors"));
  double in_memory = 1e300;
  for (int i = 0; i < repeat; ++i) {
    floor = std::min(floor, write_fsync_floor(dir / "floor", rank_bytes));
    in_memory = std::min(in_memory, copy_floor(rank_bytes));
  }
  std::printf("checkpoint: %.0f MB; every rank's shard loaded from the asynchronous save sums to the saved one's\n\n",
              bytes / 1e6);
  std::printf("| what | seconds | GB/s | against the synchronous save |\n|---|---:|---:|---:|\n");
  auto row = [&](char const* what, double seconds) {
    std::printf("| %s | %.3f | %.2f | %.3f |\n", what, seconds, bytes / seconds / 1e9, seconds / sync_seconds);
  };
  row("save_sharded, synchronous (fsync), into a new folder", sync_seconds);
  row("cp -r + sync of its files, into a new folder", cp_sync);
  row("save_sharded, synchronous, replacing the previous checkpoint (removed)", replace_seconds);
  row("rm -rf of the previous copy + cp -r + sync", rm_cp_sync);
  row("floor: write() + fsync of the same bytes from memory, 4 threads", floor);
  row("floor of a snapshot: the same bytes copied in memory, 4 threads, non-temporal stores", in_memory);
  row("async: save_sharded(..., saver) call, first save (allocates the snapshot)", call_first);
  row("async: save_sharded(..., saver) call, later saves (snapshot reused)", call_best);
  std::printf("| async: the %d poll()s until committed, the last one committing | %.3f | — | %.3f |\n", polls_best,
              finish_best, finish_best / sync_seconds);
  row("async: training thread in all (call + polls), later saves", call_best + finish_best);
  row("async: from the call to the commit, the sleep left out (background write included)", total_best);
  std::printf("| training step (forward + backward, 4 x %zu tokens), alone | %.3f | — | %.3f |\n", c.sequence,
              step_alone, step_alone / sync_seconds);
  std::printf(
      "| the same step right after an asynchronous save's call, its write in flight (outlasting the step %d of %d "
      "times) | %.3f | — | %.3f |\n",
      writes_outlasting, repeat, step_during, step_during / sync_seconds);
  std::printf("\nsynchronous save / (cp -r + sync), GB/s against GB/s: %.2f into a new folder, %.2f replacing\n",
              cp_sync / sync_seconds, rm_cp_sync / replace_seconds);
  std::printf("floor / (cp -r + sync): %.2f\n", cp_sync / floor);
  std::printf("async on the training thread / synchronous save: %.3f into a new folder, %.3f replacing\n",
              (call_best + finish_best) / sync_seconds, (call_best + finish_best) / replace_seconds);
  std::printf("floor of a snapshot / synchronous save: %.3f into a new folder, %.3f replacing\n",
              in_memory / sync_seconds, in_memory / replace_seconds);
  std::fflush(stdout);
  fs::remove_all(ckpt), fs::remove_all(async_ckpt);
  return 0;
}

int rss(int& argc, char**& argv, fs::path const& dir, std::string const& mode, bool smoke) {
  auto world = sw::mpi_world(argc, argv);
  if (world.size() != 4) {
    std::fprintf(stderr, "bench_checkpoint rss: run it on 4 MPI processes (mpiexec -n 4), not %d\n", world.size());
    return 2;
  }
  auto const c = config(smoke);
  struct Measured {
    double baseline = 0, baseline_peak = 0, peak = 0, after = 0, parameters = 0, gradients = 0, seconds = 0;
  } m;
  m.baseline = status_bytes("VmRSS");
  m.baseline_peak = status_bytes("VmHWM");
  auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(world, {4}));
  sw::Lazy<Model> lazy(c);
  sw::parallelize(lazy, tp);
  world.barrier();
  auto const start = std::chrono::steady_clock::now();
  Model* model = nullptr;
  if (mode == "sharded")
    model = &sw::load_sharded(lazy, tp, dir / "ckpt");
  else if (mode == "rank0")
    model = &sw::load_sharded(lazy, tp, dir / "ckpt", {.only_rank0_reads = true});
  else if (mode == "steps")
    model = &sw::load_sharded(lazy, tp, dir / "ckpt", {.ranks_per_step = 1});
  else if (mode == "consolidated")
    model = &sw::load_consolidated(lazy, tp, dir / "consolidated" / "model.safetensors");
  else {
    std::fprintf(stderr, "bench_checkpoint rss: --mode sharded, rank0, steps or consolidated\n");
    return 2;
  }
  world.barrier();
  m.seconds = seconds_since(start);
  m.peak = status_bytes("VmHWM");
  m.after = status_bytes("VmRSS");
  auto const f = footprint(*model);
  m.parameters = f.parameters, m.gradients = f.gradients;
  auto const all = world.all_gather_value(m);
  if (world.rank() != 0) return 0;
  char const* what = mode == "sharded" ? "load_sharded"
                     : mode == "rank0" ? "load_sharded, only_rank0_reads"
                     : mode == "steps" ? "load_sharded, ranks_per_step = 1"
                                       : "load_consolidated (one file of full tensors, sliced per rank)";
  std::printf("\n%s at TP 4, 4 MPI processes, into sw::Lazy models: %.2f s\n", what, m.seconds);
  std::printf(
      "| rank | baseline RSS | peak RSS (VmHWM) | RSS after | shard (parameters) | gradients held | "
      "peak / shard | (peak - baseline) / shard |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  constexpr double mib = 1024.0 * 1024.0;
  for (std::size_t r = 0; r < all.size(); ++r) {
    auto const& x = all[r];
    std::printf("| %zu | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | %.0f MiB | %.2f | %.2f |\n", r, x.baseline / mib,
                x.peak / mib, x.after / mib, x.parameters / mib, x.gradients / mib, x.peak / x.parameters,
                (x.peak - x.baseline) / x.parameters);
  }
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string command, mode = "sharded";
  fs::path dir;
  int repeat = 2;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--dir" && i + 1 < argc)
      dir = argv[++i];
    else if (a == "--mode" && i + 1 < argc)
      mode = argv[++i];
    else if (a == "--repeat" && i + 1 < argc)
      repeat = std::atoi(argv[++i]);
    else if (a == "--smoke")
      smoke = true;
    else if (command.empty() && (a == "throughput" || a == "rss" || a == "save"))
      command = a;
    else
      command = "?";
  }
  if (command.empty() || command == "?" || dir.empty() || repeat < 1) {
    std::fprintf(stderr,
                 "usage: bench_checkpoint throughput --dir DIR [--repeat N] [--smoke]\n"
                 "       bench_checkpoint save --dir DIR [--repeat N] [--smoke]\n"
                 "       mpiexec -n 4 bench_checkpoint rss --dir DIR --mode sharded|rank0|steps|consolidated "
                 "[--smoke]\n");
    return 2;
  }
  if (smoke) repeat = 1;
  try {
    if (command == "throughput") return throughput(dir, repeat, smoke);
    if (command == "save") return save(dir, repeat, smoke);
    return rss(argc, argv, dir, mode, smoke);
  } catch (std::exception const& e) {
    std::fprintf(stderr, "bench_checkpoint: %s\n", e.what());
    return 1;
  }
}
