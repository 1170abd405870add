// Attention across context-parallel ranks on the thread mesh at 1, 2 and 4 ranks, against single-rank attention
// (cases/context_attention_cases.hpp).
#include <doctest/doctest.h>

#include "cases/context_attention_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("ring and all-to-all attention across cp ranks equal whole-sequence attention, thread mesh") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    worlds::run_threads(ranks, [&](auto& world) {
      context_attention_cases::check_all(world);
      context_attention_cases::check_refusals(world);
    });
  }
}
