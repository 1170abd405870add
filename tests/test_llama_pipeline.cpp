// The Llama model trained in pipeline stages on the thread mesh at 1, 2 and 4 ranks, with tp and dp beside the
// pipeline at 4, against the unsharded run (cases/llama_pipeline_cases.hpp).
#include <doctest/doctest.h>

#include "cases/llama_pipeline_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("Llama in pipeline stages: loss curves and parameters equal the unsharded run, thread mesh") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    worlds::run_threads(ranks, [&](auto& world) { llama_pipeline_cases::check_all(world, llama_cases::steps()); });
  }
}

TEST_CASE("LlamaStage: a split of another layer count is refused; tied embeddings are copied across stages") {
  namespace models = shardwise::models;
  auto c = llama_pipeline_cases::config();
  shardwise::stage_split const split(c.layers, 2);
  CHECK_THROWS_WITH_AS(models::LlamaStage<float>(c, shardwise::stage_split(c.layers + 2, 2), 0),
                       doctest::Contains("the stage split cuts 6 layers but the config has 4"), shardwise::error);
  c.tie_word_embeddings = true;
  models::LlamaStage<float> whole(c, shardwise::stage_split(c.layers, 1), 0);  // one stage: tied as in Llama
  CHECK(whole.output->weight.size() == 0);                                     // computes with the embedding's table
  models::LlamaStage<float> first(c, split, 0), last(c, split, 1);  // across stages: a copy, equal at the start
  CHECK(last.output->weight == first.tok_embeddings->weight);
  // Interleaved chunks with the first and last stage on one rank cannot exchange with themselves: refused.
  worlds::run_threads(1, [&](auto& world) {
    auto const pp = shardwise::make_mesh<"pp">(world, {1});
    CHECK_THROWS_WITH_AS(first.shardwise_after_pipeline_step(pp),
                         doctest::Contains("with the first and last stages on one rank"), shardwise::error);
  });
}
