// The Llama model trained in pipeline stages on the thread mesh at 1, 2 and 4 ranks, with tp and dp beside the
// pipeline at 4, against the unsharded run (cases/llama_pipeline_cases.hpp).
#include <doctest/doctest.h>

#include "cases/llama_pipeline_cases.hpp"

TEST_CASE("Llama in pipeline stages: loss curves and parameters equal the unsharded run, thread mesh") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    shardwise::run_threads(ranks, [&](auto& world) { llama_pipeline_cases::check_all(world, llama_cases::steps()); });
  }
}
