// How close the thread mesh's all-reduce is to the bare loop it runs: two threads sum two float buffers in
// place, each thread its half of both buffers (the one-pass scheme of ThreadComm's all-reduce), timed beside
// sw::all_reduce on a 2-thread ThreadComm mesh over buffers of the same size, in one run.
//
//   bench_thread_reduce_floor [--smoke]
//
// The bare loop has no shape check, no exchange and no library code: it is the floor set by the memory system
// (each call reads and writes every byte of both buffers). Per-call time = median over 300 calls, after 30
// warm-up calls; both variants alternate in blocks of 10 calls so that drift hits both alike.
#include <Eigen/Core>
#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "median.hpp"
#include "shardwise/adapters/eigen.hpp"
#include "shardwise/mesh/collectives.hpp"

namespace sw = shardwise;
using clock_type = std::chrono::steady_clock;

namespace {

/// The bare loop: thread `me` of 2 sums its half of both buffers and stores the sum into both.
void bare_piece(float* a, float* b, std::size_t n, int me) {
  std::size_t const half = (n + 1) / 2, start = me == 0 ? 0 : half, count = me == 0 ? half : n - half;
  float* const x = a + start;
  float* const y = b + start;
  for (std::size_t i = 0; i < count; ++i) {
    float const s = x[i] + y[i];
    x[i] = s;
    y[i] = s;
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool const smoke = argc > 1 && std::strcmp(argv[1], "--smoke") == 0;
  int const calls = smoke ? 2 : 300, warmup = smoke ? 1 : 30, block = smoke ? 1 : 10;
  std::printf("| size | bare loop µs | sw::all_reduce (ThreadComm) µs | shardwise / bare | memcpy µs |\n");
  std::printf("|---:|---:|---:|---:|---:|\n");
  bool all_correct = true;
  for (std::size_t bytes : {std::size_t{1} << 20, std::size_t{4} << 20, std::size_t{16} << 20}) {
    std::size_t const n = bytes / sizeof(float);
    std::vector<Eigen::VectorXf> buffers(2, Eigen::VectorXf::Ones(static_cast<Eigen::Index>(n)));
    std::vector<double> bare, library;
    std::barrier sync(2);
    sw::run_threads(2, [&](sw::ThreadComm& world) {
      int const me = world.rank();
      auto mesh = sw::make_mesh<"tp">(world, {2});
      Eigen::VectorXf& mine = buffers[static_cast<std::size_t>(me)];
      for (int done = -warmup; done < calls; done += block) {
        for (int variant = 0; variant < 2; ++variant) {
          for (int k = 0; k < block; ++k) {
            sync.arrive_and_wait();
            auto const start = clock_type::now();
            if (variant == 0)
              bare_piece(buffers[0].data(), buffers[1].data(), n, me);
            else
              sw::all_reduce(sw::submesh<"tp">(mesh), mine);
            sync.arrive_and_wait();
            double const us = std::chrono::duration<double, std::micro>(clock_type::now() - start).count();
            if (me == 0 && done >= 0) (variant == 0 ? bare : library).push_back(us);
          }
          // Keep the values bounded (every call doubles them): back to ones, outside the timed region.
          sync.arrive_and_wait();
          if (me == 0) {
            // Both variants double every element per call: after k calls from ones, every element is 2^k.
            float const expected = static_cast<float>(1u << block);
            for (auto const& b : buffers) all_correct = all_correct && (b.array() == expected).all();
          }
          sync.arrive_and_wait();
          mine.setOnes();
          sync.arrive_and_wait();
        }
      }
    });
    std::vector<float> from(n, 1.0f), to(n);
    std::vector<double> copy;
    for (int k = 0; k < calls; ++k) {
      auto const start = clock_type::now();
      std::memcpy(to.data(), from.data(), bytes);
      copy.push_back(std::chrono::duration<double, std::micro>(clock_type::now() - start).count());
    }
    volatile float const sink = to[n - 1];  // the copies are used, so none is optimized away
    (void)sink;
    std::printf("| %zu MiB | %.1f | %.1f | %.3f | %.1f |\n", bytes >> 20, bench::median(bare), bench::median(library),
                bench::median(library) / bench::median(bare), bench::median(copy));
  }
  std::printf("\nresults: %s\n", all_correct ? "all correct" : "WRONG");
  return all_correct ? 0 : 1;
}
