// The fuzz target (readers_fuzz.cpp) for a planner machine file (scripts/fuzz.sh): any text must either give a machine
// whose rates are finite, positive and within the documented ranges, or be refused with shardwise::error.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <shardwise/planner/machine_file.hpp>
#include <string_view>

namespace fuzz_readers {
namespace sw = shardwise;

inline void machine_file(std::uint8_t const* data, std::size_t size) {
  try {
    auto const m =
        sw::planner::machine_from_json(std::string_view(reinterpret_cast<char const*>(data), size), "fuzz.json");
    for (double rate : {m.gemm_flops, m.memory_bandwidth, m.tp.bandwidth, m.dp.bandwidth, m.pp.bandwidth, m.tp.latency,
                        m.dp.latency, m.pp.latency})
      if (!(std::isfinite(rate) && rate > 0)) __builtin_trap();
    namespace range = sw::planner::detail;  // and within the documented ranges (docs/planning.md)
    auto const within = [](double value, range::machine_range r) { return value >= r.least && value <= r.most; };
    if (!within(m.gemm_flops, range::gemm_flops_range) || !within(m.memory_bandwidth, range::memory_bandwidth_range) ||
        !within(m.gemm_half_rate_tokens, range::half_rate_tokens_range))
      __builtin_trap();
    for (auto const& link : {m.tp, m.dp, m.pp})
      if (!within(link.bandwidth, range::link_bandwidth_range) || !within(link.latency, range::latency_range))
        __builtin_trap();
  } catch (sw::error const&) {
    // refused with a message: what bad input must get
  }
}
}  // namespace fuzz_readers
