#pragma once
// What the ranks of a pipeline axis agree on before a step moves any data (run_pipeline_step), here so that the
// cost of a step (pipeline/cost.hpp) counts the same record.
#include <array>
#include <cstdint>

#include "shardwise/mesh/call.hpp"

namespace shardwise::detail {

/// What the ranks of the pipeline axis must agree on before a step moves any data: the schedule (its type's
/// name), the microbatches and the chunks per rank. Ranks that differ would wait for messages never sent.
struct pipeline_step_terms {
  std::array<char, 64> schedule{};
  std::int32_t microbatches = 0;
  std::int32_t chunks = 0;

  [[nodiscard]] bool same(pipeline_step_terms const& other) const {
    return text_of(schedule) == text_of(other.schedule) && microbatches == other.microbatches && chunks == other.chunks;
  }
};

}  // namespace shardwise::detail
