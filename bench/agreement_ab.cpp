// The call-agreement check's cost on the thread mesh, A/B in one process: the all-reduce and all-gather of a
// base commit (before the check) and of this tree, compiled side by side (agreement_side.cpp, namespace
// renamed) and run alternately in short batches, so that this machine's drift (±20% between runs of one
// binary) hits both alike. Prints per size the median over rounds of base µs, head µs and head/base.
//   bench_agreement_ab [rounds [KiB]]      (built by bench/run_agreement_cost.sh)
//   bench_agreement_ab alone               each side alone: 20 x 20,000 all-reduces of 4 KiB, sides alternating

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string_view>
#include <vector>

#include "median.hpp"

double shardwise_base_time_collective(std::size_t bytes, int calls, bool gather);
double shardwise_head_time_collective(std::size_t bytes, int calls, bool gather);

/// Each side alone, long runs, alternating: the per-call constant at 4 KiB without the short-batch noise.
void alone() {
  for (int pass = 0; pass < 2; ++pass)
    for (bool head : {false, true}) {
      double total = 0;
      for (int r = 0; r < 20; ++r)
        total += head ? shardwise_head_time_collective(4096, 20000, false)
                      : shardwise_base_time_collective(4096, 20000, false);
      std::printf("%s all_reduce 4 KiB: %.3f µs per call\n", head ? "head" : "base", total / 20);
    }
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string_view(argv[1]) == "alone") return alone(), 0;
  int const rounds = argc > 1 ? std::atoi(argv[1]) : 41;
  std::size_t const only_kib = argc > 2 ? static_cast<std::size_t>(std::atoi(argv[2])) : 0;  // one size only
  for (bool gather : {false, true}) {
    std::printf("\n%s, thread mesh of 2 ranks, A/B in one process (median of %d alternating rounds)\n\n",
                gather ? "all_gather" : "all_reduce", rounds);
    std::printf("| size | base µs | head µs | head/base (median of per-round ratios) |\n|---:|---:|---:|---:|\n");
    for (std::size_t kib : {4, 64, 256, 1024, 4096}) {
      if (only_kib != 0 && kib != only_kib) continue;
      std::size_t const bytes = kib * 1024;
      int const calls = static_cast<int>(std::max<std::size_t>(20, (std::size_t{64} << 20) / bytes / 4));
      std::vector<double> base, head, ratio;
      for (int r = 0; r < rounds; ++r) {
        bool const base_first = r % 2 == 0;  // neither side always runs first
        double const a = base_first ? shardwise_base_time_collective(bytes, calls, gather) : 0;
        double const b = shardwise_head_time_collective(bytes, calls, gather);
        double const a2 = base_first ? a : shardwise_base_time_collective(bytes, calls, gather);
        base.push_back(a2), head.push_back(b), ratio.push_back(b / a2);
      }
      std::printf("| %zu KiB | %.2f | %.2f | %.3f |\n", kib, bench::median(base), bench::median(head),
                  bench::median(ratio));
    }
  }
  return 0;
}
