// Collectives benchmark: raw MPI against shardwise on an MPI mesh and on a thread mesh, with a memcpy floor.
//
//   mpiexec -n 2 --bind-to none bench_collectives [--smoke]
//
// Part 1 (every rank): in-place MPI_Allreduce against sw::all_reduce, and MPI_Allgather against
// sw::all_gather, on float data. Raw and shardwise calls run on the same buffers in alternating batches, so
// drift on a shared machine hits both alike. Part 2 (rank 0 only): a single-thread memcpy of the same bytes,
// and the same collectives on a ThreadComm mesh of as many threads as there are MPI ranks. Meanwhile the
// other ranks wait in MPI_Ibarrier, polled every millisecond: OpenMPI's blocking barrier busy-polls and would
// take a core away from the threads. Rank 0 needs two cores, so launch without core binding.
//
// Timing: a first untimed call, a short estimate, a warm-up batch, then batches of ~13 ms (at least one call)
// — 25 batches, fewer for very slow calls, about 0.3-0.7 s per variant and size. Reported: the median over
// batches of the per-call time, taken on rank 0 from a barrier to the end of its last call; shardwise/raw is
// the median of the ratios of batches that ran back to back. "Effective GB/s" is message bytes (the
// all-reduced vector, the gathered output) per second. --smoke: one call per size, sizes up to 1 MiB, results
// checked, times meaningless.
#include "shardwise/mesh/collectives.hpp"

#include <mpi.h>
#include <sched.h>
#include <sys/resource.h>
#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <exception>
#include <fstream>
#include <functional>
#include <iterator>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shardwise/adapters/eigen.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/mesh/mpi/comm.hpp"
#include "shardwise/mesh/thread/comm.hpp"

namespace sw = shardwise;

namespace {

// ---------------------------------------------------------------------------------------------------------
// Timing harness

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

/// Per-call seconds of one variant at one size: median, fastest and slowest batch.
struct stats {
  double median = 0, lo = 0, hi = 0;
  double faults = 0;              // minor page faults per call in this process, over the timed batches
  std::vector<double> per_batch;  // per-call time of each batch, in the order they ran
  int iters = 0, batches = 0;
  [[nodiscard]] double spread() const { return median > 0 ? (hi - lo) / median : 0; }
};

double median_of(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  std::size_t const n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

stats summarize(std::vector<double> per_call, int iters) {
  stats s;
  s.per_batch = per_call;
  s.median = median_of(per_call);
  s.lo = *std::min_element(per_call.begin(), per_call.end());
  s.hi = *std::max_element(per_call.begin(), per_call.end());
  s.iters = iters;
  s.batches = static_cast<int>(per_call.size());
  return s;
}

/// b relative to a, from batches that ran back to back (a and b alternate): the median of the per-batch
/// ratios, which drift on a shared machine affects far less than a ratio of two medians.
double paired_ratio(stats const& a, stats const& b) {
  std::vector<double> ratios;
  for (std::size_t i = 0; i < a.per_batch.size() && i < b.per_batch.size(); ++i)
    ratios.push_back(b.per_batch[i] / a.per_batch[i]);
  return ratios.empty() ? 0 : median_of(std::move(ratios));
}

/// How the ranks taking part in a timed loop line up (barrier) and agree on a number (maximum).
struct sync {
  std::function<void()> barrier;
  std::function<double(double)> max_all;
};

using op = std::function<void()>;

/// Minor page faults of this process so far: an allocation mapped afresh on every call shows up here.
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

/// Times each op (all collective across the ranks of `s`), in alternating order per batch. Every rank runs
/// the same number of calls; the returned times are this rank's.
std::vector<stats> time_ops(sync const& s, std::vector<op> const& ops, bool smoke) {
  std::size_t const k = ops.size();
  std::vector<long> faults(k, 0);
  auto batch = [&](std::size_t i, int iters) {
    s.barrier();
    long const f0 = minor_faults();
    double const t0 = seconds_now();
    for (int it = 0; it < iters; ++it) ops[i]();
    double const t1 = seconds_now();
    faults[i] += minor_faults() - f0;
    return (t1 - t0) / iters;
  };
  std::vector<stats> out(k);
  if (smoke) {
    for (std::size_t i = 0; i < k; ++i) out[i] = summarize({batch(i, 1)}, 1);
    return out;
  }
  for (auto const& f : ops) f();  // first touch of the pages, lazy set-up inside MPI
  double estimate = 0;
  for (std::size_t i = 0; i < k; ++i) estimate = std::max(estimate, batch(i, 2));
  estimate = s.max_all(estimate);  // every rank must plan the same number of calls
  constexpr double batch_target = 0.013, variant_budget = 0.7;
  int const iters = std::max(1, static_cast<int>(std::lround(batch_target / estimate)));
  double const batch_time = iters * estimate;
  int batches = 25;  // 11 left the 4 MiB all-gather ratio swinging 1.03-1.15 between runs of the same binary
  if (batch_time * batches > variant_budget) batches = std::max(3, static_cast<int>(variant_budget / batch_time));
  for (std::size_t i = 0; i < k; ++i) batch(i, iters);  // warm-up
  std::fill(faults.begin(), faults.end(), 0);
  std::vector<std::vector<double>> per_call(k);
  for (int b = 0; b < batches; ++b)
    for (std::size_t j = 0; j < k; ++j) {
      std::size_t const i = b % 2 ? k - 1 - j : j;
      per_call[i].push_back(batch(i, iters));
    }
  for (std::size_t i = 0; i < k; ++i) {
    out[i] = summarize(std::move(per_call[i]), iters);
    out[i].faults = static_cast<double>(faults[i]) / (static_cast<double>(iters) * batches);
  }
  return out;
}

/// Keeps the compiler from dropping a copy whose result is never read.
inline void clobber(void* p) { asm volatile("" : : "r"(p) : "memory"); }

// ---------------------------------------------------------------------------------------------------------
// Data and checks

constexpr std::array<std::size_t, 8> all_sizes{std::size_t{4} << 10,   std::size_t{16} << 10, std::size_t{64} << 10,
                                               std::size_t{256} << 10, std::size_t{1} << 20,  std::size_t{4} << 20,
                                               std::size_t{16} << 20,  std::size_t{64} << 20};

/// Rank r's all-reduce input: small integers, so any summation order gives exact results.
void fill_reduce(Eigen::VectorXf& v, int rank) {
  for (Eigen::Index i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank + 1 + i % 7);
}
bool check_reduce(Eigen::VectorXf const& v, int ranks) {
  for (Eigen::Index i = 0; i < v.size(); ++i)
    if (v[i] != static_cast<float>(ranks * (ranks + 1) / 2 + ranks * (i % 7))) return false;
  return true;
}
void fill_gather(Eigen::VectorXf& v, int rank) {
  for (Eigen::Index i = 0; i < v.size(); ++i) v[i] = static_cast<float>(rank * 1000 + i % 1000);
}
bool check_gather(Eigen::VectorXf const& out, std::size_t piece, int ranks) {
  if (static_cast<std::size_t>(out.size()) != piece * static_cast<std::size_t>(ranks)) return false;
  for (int q = 0; q < ranks; ++q)
    for (std::size_t i = 0; i < piece; ++i)
      if (out[static_cast<Eigen::Index>(q * piece + i)] != static_cast<float>(q * 1000 + i % 1000)) return false;
  return true;
}

// ---------------------------------------------------------------------------------------------------------
// Results and report

struct row {
  std::size_t bytes = 0;
  stats raw, mesh_mpi, threads, copy;
};

struct results {
  std::vector<row> reduce, gather;
  std::string mpi_ranks;  // where each rank ran during the MPI part, and how often it was preempted
  bool ok = true;
  std::vector<std::string> failures;
  void fail(std::string what) {
    ok = false;
    failures.push_back(std::move(what));
  }
};

std::string size_name(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

std::string fmt(double value, int decimals) {
  char text[64];
  std::snprintf(text, sizeof text, "%.*f", decimals, value);
  return text;
}
std::string micros(double seconds) {
  double const us = seconds * 1e6;
  return fmt(us, us < 10 ? 2 : us < 1000 ? 1 : 0);
}
std::string gbps(std::size_t bytes, double seconds) { return fmt(static_cast<double>(bytes) / seconds / 1e9, 2); }

std::string read_text(char const* path) {
  std::ifstream in(path, std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (char& c : text)
    if (c == '\0') c = ' ';
  while (!text.empty() && (text.back() == ' ' || text.back() == '\n')) text.pop_back();
  return text;
}

/// CPU time the hypervisor gave to others while this VM wanted it ("steal"), all CPUs, in milliseconds.
double steal_ms() {
  std::istringstream cpu(read_text("/proc/stat"));
  std::string label;
  double user, nice, system, idle, iowait, irq, softirq, steal = 0;
  cpu >> label >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal;
  return label == "cpu" ? steal * 1000.0 / static_cast<double>(sysconf(_SC_CLK_TCK)) : 0;
}

std::string utc_now() {
  std::time_t const t = std::time(nullptr);
  char text[64];
  std::strftime(text, sizeof text, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&t));
  return text;
}

void print_table(std::string const& title, char const* raw_name, char const* mesh_name, std::vector<row> const& rows,
                 int ranks) {
  std::printf("\n### %s\n\n", title.c_str());
  std::printf(
      "| size | %s µs | sw-MPI µs | sw-MPI/raw | thread-mesh µs | raw/thread (speedup) | memcpy µs | "
      "GB/s raw | GB/s sw-MPI | GB/s thread | GB/s memcpy | page faults/call raw · sw-MPI · thread |\n",
      raw_name);
  std::printf("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  for (auto const& r : rows) {
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s · %s · %s |\n", size_name(r.bytes).c_str(),
                micros(r.raw.median).c_str(), micros(r.mesh_mpi.median).c_str(),
                fmt(paired_ratio(r.raw, r.mesh_mpi), 3).c_str(), micros(r.threads.median).c_str(),
                fmt(r.raw.median / r.threads.median, 2).c_str(), micros(r.copy.median).c_str(),
                gbps(r.bytes, r.raw.median).c_str(), gbps(r.bytes, r.mesh_mpi.median).c_str(),
                gbps(r.bytes, r.threads.median).c_str(), gbps(r.bytes, r.copy.median).c_str(),
                fmt(r.raw.faults, 0).c_str(), fmt(r.mesh_mpi.faults, 0).c_str(), fmt(r.threads.faults, 0).c_str());
  }
  // Noise: the widest batch-to-batch spread of each column.
  auto worst = [&](stats row::* column) {
    row const* w = &rows.front();
    for (auto const& r : rows)
      if ((r.*column).spread() > (w->*column).spread()) w = &r;
    return fmt(100 * (w->*column).spread(), 0) + "% (" + size_name(w->bytes) + ")";
  };
  std::printf(
      "\nraw = `%s` on MPI_COMM_WORLD; sw-MPI = `sw::%s` on an MpiComm mesh; thread-mesh = the same on a "
      "ThreadComm mesh of %d threads in rank 0; memcpy = one thread copying `size` bytes. Batch spread "
      "(slowest − fastest batch) / median, worst size: raw %s, sw-MPI %s, thread %s, memcpy %s.\n",
      raw_name, mesh_name, ranks, worst(&row::raw).c_str(), worst(&row::mesh_mpi).c_str(), worst(&row::threads).c_str(),
      worst(&row::copy).c_str());
}

void report(results const& res, int argc, char** argv, int ranks, int rank0_cpus, std::string const& load_start,
            double steal_start, double wall_start, bool smoke) {
  std::printf("# shardwise collectives benchmark%s\n\n",
              smoke ? " (smoke run: one call per size, not a measurement)" : "");
  std::printf("- date: %s\n", utc_now().c_str());
  std::string command = read_text(("/proc/" + std::to_string(getppid()) + "/cmdline").c_str());
  std::string binary;
  for (int i = 0; i < argc; ++i) binary += (i ? " " : "") + std::string(argv[i]);
  std::printf("- launched by: `%s`\n", command.c_str());
  std::printf("- command line (rank 0): `%s` on %d MPI ranks\n", binary.c_str(), ranks);
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  char library[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(library, &length);
  std::string mpi_version(library, static_cast<std::size_t>(length));
  mpi_version = mpi_version.substr(0, mpi_version.find_first_of(",\n"));
  std::printf("- host: %s, %u hardware threads, rank 0 may run on %d CPUs; %s; compiler %s; Eigen %d.%d.%d\n", host,
              std::thread::hardware_concurrency(), rank0_cpus, mpi_version.c_str(), __VERSION__, EIGEN_WORLD_VERSION,
              EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION);
  std::printf("- MPI part: %s\n", res.mpi_ranks.c_str());
  std::printf(
      "- load average at start: %s; at end: %s; CPU time stolen by the hypervisor during the run: %.0f ms "
      "in %.1f s\n",
      load_start.c_str(), read_text("/proc/loadavg").c_str(), steal_ms() - steal_start, seconds_now() - wall_start);
  if (rank0_cpus < ranks)
    std::printf(
        "- **warning**: rank 0 may use only %d CPU(s), so its %d thread ranks share them and the thread-mesh "
        "column is meaningless; launch with `--bind-to none`\n",
        rank0_cpus, ranks);
  std::printf(
      "- per-call times: median over batches of ~13 ms (25 batches, fewer for slow calls), after warm-up; "
      "sw-MPI/raw: median of the ratios of back-to-back batches; effective GB/s = message bytes / time; page "
      "faults/call = minor page faults of rank 0's process per call "
      "(a buffer mapped afresh on every call shows up there)\n");

  print_table("all_reduce (float, sum, in place)", "MPI_Allreduce", "all_reduce", res.reduce, ranks);
  print_table("all_gather (float; size = gathered output, each rank contributes size / ranks)", "MPI_Allgather",
              "all_gather", res.gather, ranks);

  if (!smoke) {
    std::printf("\n### Targets\n\n");
    auto within = [&](std::vector<row> const& rows, char const* name) {
      double worst = 0;
      std::size_t at = 0;
      for (auto const& r : rows)
        if (r.bytes >= (std::size_t{256} << 10) && paired_ratio(r.raw, r.mesh_mpi) > worst) {
          worst = paired_ratio(r.raw, r.mesh_mpi);
          at = r.bytes;
        }
      std::printf("- sw-MPI %s within 5%% of raw MPI at >= 256 KiB: worst ratio %.3f at %s — %s\n", name, worst,
                  size_name(at).c_str(), worst <= 1.05 ? "met" : "NOT met");
    };
    within(res.reduce, "all_reduce");
    within(res.gather, "all_gather");
    for (auto const& r : res.reduce)
      if (r.bytes == (std::size_t{4} << 20)) {
        double const speedup = r.raw.median / r.threads.median;
        std::printf("- thread-mesh all_reduce at 4 MiB >= 4x faster than in-place MPI_Allreduce: %.2fx — %s\n", speedup,
                    speedup >= 4 ? "met" : "NOT met");
      }
  }
  std::printf("\nResults checked on every rank: %s\n", res.ok ? "all correct" : "FAILURES");
  for (auto const& f : res.failures) std::printf("- %s\n", f.c_str());
}

// ---------------------------------------------------------------------------------------------------------
// Part 1: MPI

void mpi_part(sw::MpiComm const& world, std::vector<std::size_t> const& sizes, bool smoke, results& res) {
  auto mesh = sw::make_mesh<"tp">(world, {world.size()});
  auto tp = mesh.axis<"tp">();
  int const rank = world.rank(), ranks = world.size();
  sync const s{[] { MPI_Barrier(MPI_COMM_WORLD); },
               [](double x) {
                 MPI_Allreduce(MPI_IN_PLACE, &x, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
                 return x;
               }};
  auto all_ok = [&](bool mine) {
    int flag = mine ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &flag, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return flag == 1;
  };

  for (std::size_t bytes : sizes) {
    std::size_t const n = bytes / sizeof(float);
    int const count = static_cast<int>(n);
    Eigen::VectorXf v(static_cast<Eigen::Index>(n));
    fill_reduce(v, rank);
    MPI_Allreduce(MPI_IN_PLACE, v.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (!all_ok(check_reduce(v, ranks))) res.fail("MPI_Allreduce " + size_name(bytes));
    fill_reduce(v, rank);
    sw::all_reduce(tp, v);
    if (!all_ok(check_reduce(v, ranks))) res.fail("sw::all_reduce on MPI " + size_name(bytes));
    v.setZero();  // sums of zeros stay zero: no overflow, no denormals over thousands of calls
    auto t = time_ops(s,
                      {[&] { MPI_Allreduce(MPI_IN_PLACE, v.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
                       [&] { sw::all_reduce(tp, v); }},
                      smoke);
    res.reduce.push_back({bytes, t[0], t[1], {}, {}});
  }

  for (std::size_t bytes : sizes) {
    std::size_t const piece = bytes / sizeof(float) / static_cast<std::size_t>(ranks);
    int const count = static_cast<int>(piece);
    Eigen::VectorXf in(static_cast<Eigen::Index>(piece)), out(static_cast<Eigen::Index>(piece * ranks));
    fill_gather(in, rank);
    out.setZero();
    MPI_Allgather(in.data(), count, MPI_FLOAT, out.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
    if (!all_ok(check_gather(out, piece, ranks))) res.fail("MPI_Allgather " + size_name(bytes));
    out.setZero();
    sw::all_gather(tp, in, out, 0);
    if (!all_ok(check_gather(out, piece, ranks))) res.fail("sw::all_gather on MPI " + size_name(bytes));
    auto t =
        time_ops(s,
                 {[&] { MPI_Allgather(in.data(), count, MPI_FLOAT, out.data(), count, MPI_FLOAT, MPI_COMM_WORLD); },
                  [&] { sw::all_gather(tp, in, out, 0); }},
                 smoke);
    res.gather.push_back({bytes, t[0], t[1], {}, {}});
  }
}

// ---------------------------------------------------------------------------------------------------------
// Part 2: rank 0 alone — memcpy floor and the thread mesh

void memcpy_part(std::vector<std::size_t> const& sizes, bool smoke, results& res) {
  sync const alone{[] {}, [](double x) { return x; }};
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    std::size_t const bytes = sizes[i];
    std::vector<float> src(bytes / sizeof(float), 1.0f), dst(bytes / sizeof(float), 0.0f);
    auto t = time_ops(alone, {[&] {
                        std::memcpy(dst.data(), src.data(), bytes);
                        clobber(dst.data());
                      }},
                      smoke);
    res.reduce[i].copy = res.gather[i].copy = t[0];
  }
}

void thread_part(int ranks, std::vector<std::size_t> const& sizes, bool smoke, results& res) {
  // Shared by the thread ranks: each publishes its estimate, both plan with the larger.
  std::vector<double> estimates(static_cast<std::size_t>(ranks));
  std::vector<char> reduce_ok(sizes.size() * static_cast<std::size_t>(ranks), 1),
      gather_ok(sizes.size() * static_cast<std::size_t>(ranks), 1);

  sw::run_threads(ranks, [&](sw::ThreadComm& world) {
    auto mesh = sw::make_mesh<"tp">(world, {world.size()});
    auto tp = mesh.axis<"tp">();
    int const rank = world.rank();
    sync const s{[&] { world.barrier(); },
                 [&](double x) {
                   estimates[static_cast<std::size_t>(rank)] = x;
                   world.barrier();
                   double const m = *std::max_element(estimates.begin(), estimates.end());
                   world.barrier();  // everyone has read before anyone writes again
                   return m;
                 }};
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::size_t const n = sizes[i] / sizeof(float);
      Eigen::VectorXf v(static_cast<Eigen::Index>(n));
      fill_reduce(v, rank);
      sw::all_reduce(tp, v);
      reduce_ok[i * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(rank)] = check_reduce(v, ranks);
      v.setZero();
      auto t = time_ops(s, {[&] { sw::all_reduce(tp, v); }}, smoke);
      if (rank == 0) res.reduce[i].threads = t[0];
    }
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      std::size_t const piece = sizes[i] / sizeof(float) / static_cast<std::size_t>(ranks);
      Eigen::VectorXf in(static_cast<Eigen::Index>(piece)), out(static_cast<Eigen::Index>(piece * ranks));
      fill_gather(in, rank);
      out.setZero();
      sw::all_gather(tp, in, out, 0);
      gather_ok[i * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(rank)] = check_gather(out, piece, ranks);
      auto t = time_ops(s, {[&] { sw::all_gather(tp, in, out, 0); }}, smoke);
      if (rank == 0) res.gather[i].threads = t[0];
    }
  });
  for (std::size_t i = 0; i < sizes.size(); ++i)
    for (int r = 0; r < ranks; ++r) {
      std::size_t const k = i * static_cast<std::size_t>(ranks) + static_cast<std::size_t>(r);
      if (!reduce_ok[k]) res.fail("sw::all_reduce on threads " + size_name(sizes[i]) + ", thread " + std::to_string(r));
      if (!gather_ok[k]) res.fail("sw::all_gather on threads " + size_name(sizes[i]) + ", thread " + std::to_string(r));
    }
}

/// The ranks other than 0 wait here without occupying a core while rank 0 works alone.
void idle_until_rank0_done() {
  MPI_Request request;
  MPI_Ibarrier(MPI_COMM_WORLD, &request);
  int done = 0;
  while (true) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    std::string_view const arg = argv[i];
    if (arg == "--smoke") {
      smoke = true;
    } else {
      std::fprintf(stderr, "usage: mpiexec -n 2 --bind-to none %s [--smoke]\n", argv[0]);
      return 2;
    }
  }
  try {
    auto world = sw::mpi_world(argc, argv);
    int const rank = world.rank(), ranks = world.size();
    std::string const load_start = read_text("/proc/loadavg");
    double const steal_start = steal_ms(), wall_start = seconds_now();
    std::vector<std::size_t> sizes;
    for (std::size_t bytes : all_sizes)
      if (!smoke || bytes <= (std::size_t{1} << 20)) sizes.push_back(bytes);

    results res;
    rusage before{}, after{};
    getrusage(RUSAGE_SELF, &before);
    int const cpu_before = sched_getcpu();
    mpi_part(world, sizes, smoke, res);
    getrusage(RUSAGE_SELF, &after);
    long const mine[3] = {cpu_before * 1000L + sched_getcpu(), after.ru_nivcsw - before.ru_nivcsw,
                          after.ru_nvcsw - before.ru_nvcsw};
    std::vector<long> all(3 * static_cast<std::size_t>(ranks));
    MPI_Gather(mine, 3, MPI_LONG, all.data(), 3, MPI_LONG, 0, MPI_COMM_WORLD);
    for (int r = 0; r < ranks; ++r) {
      long const* a = &all[3 * static_cast<std::size_t>(r)];
      res.mpi_ranks += (r ? "; rank " : "rank ") + std::to_string(r) + " on CPU " + std::to_string(a[0] / 1000) +
                       " then " + std::to_string(a[0] % 1000) + ", " + std::to_string(a[1]) + " involuntary / " +
                       std::to_string(a[2]) + " voluntary context switches";
    }

    int rank0_cpus = 0;
    if (rank == 0) {
      cpu_set_t set;
      CPU_ZERO(&set);
      if (sched_getaffinity(0, sizeof set, &set) == 0) rank0_cpus = CPU_COUNT(&set);
      memcpy_part(sizes, smoke, res);
      thread_part(ranks, sizes, smoke, res);
      MPI_Request request;
      MPI_Ibarrier(MPI_COMM_WORLD, &request);
      MPI_Wait(&request, MPI_STATUS_IGNORE);
    } else {
      idle_until_rank0_done();
    }

    // Results of the MPI part were checked on every rank; rank 0 also knows the thread part's.
    int ok = res.ok ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (rank == 0) {
      report(res, argc, argv, ranks, rank0_cpus, load_start, steal_start, wall_start, smoke);
      std::fflush(stdout);
    }
    return ok ? 0 : 1;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "bench_collectives: %s\n", e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
    return 3;
  }
}
