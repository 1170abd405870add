// Attention across context-parallel ranks on the thread mesh at 1, 2 and 4 ranks, against single-rank attention
// (cases/context_attention_cases.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

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

TEST_CASE("context_split::tokens_of takes each rank's tokens of whole sequences, and refuses a part of one") {
  std::vector<std::int64_t> ids(14);  // two sequences of 7 tokens: 100..106, 107..113
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = 100 + static_cast<std::int64_t>(i);
  // Balanced over 3 ranks: 6 chunks of 2,1,1,1,1,1 tokens; rank r holds chunks r and 5 - r.
  shardwise::context_split const balanced{7, 3};
  CHECK(balanced.tokens_of(ids, 0) == std::vector<std::int64_t>{100, 101, 106, 107, 108, 113});
  CHECK(balanced.tokens_of(ids, 1) == std::vector<std::int64_t>{102, 105, 109, 112});
  CHECK(balanced.tokens_of(ids, 2) == std::vector<std::int64_t>{103, 104, 110, 111});
  // Contiguous over 3 ranks: chunks of 3, 2 and 2 tokens.
  shardwise::context_split const contiguous{7, 3, false};
  CHECK(contiguous.tokens_of(ids, 0) == std::vector<std::int64_t>{100, 101, 102, 107, 108, 109});
  CHECK(contiguous.tokens_of(ids, 2) == std::vector<std::int64_t>{105, 106, 112, 113});
  ids.pop_back();
  CHECK_THROWS_WITH_AS((void)balanced.tokens_of(ids, 0),
                       doctest::Contains("tokens_of: 13 tokens are not whole sequences of 7 tokens; give it tokens "
                                         "of whole sequences"),
                       shardwise::error);
}
