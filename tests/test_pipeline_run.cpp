// Pipeline steps on the thread mesh at 1, 2 and 4 pipeline ranks against the unsharded run (cases/pipeline_cases.hpp).
#include <doctest/doctest.h>

#include "cases/pipeline_cases.hpp"

TEST_CASE("run_pipeline_step: GPipe, 1F1B and interleaved 1F1B equal the unsharded run, thread mesh") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " pipeline ranks");
    shardwise::run_threads(ranks, [&](auto& world) {
      auto const pp = shardwise::make_mesh<"pp">(world, {ranks});
      pipeline_cases::check_all(pp);
      pipeline_cases::check_refusal(pp);
    });
  }
}
