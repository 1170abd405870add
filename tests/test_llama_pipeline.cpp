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

TEST_CASE("LlamaStage refuses what it cannot do, naming it") {
  namespace models = shardwise::models;
  auto c = llama_pipeline_cases::config();
  shardwise::stage_split const split(c.layers, 2);
  CHECK_THROWS_WITH_AS(models::LlamaStage<float>(c, shardwise::stage_split(c.layers + 2, 2), 0),
                       doctest::Contains("the stage split cuts 6 layers but the config has 4"), shardwise::error);
  c.tie_word_embeddings = true;  // the embedding on stage 0, the output on stage 1: not shared across stages yet
  CHECK_THROWS_WITH_AS(models::LlamaStage<float>(c, split, 1),
                       doctest::Contains("tie_word_embeddings puts the embedding on the first stage"),
                       shardwise::error);
  models::LlamaStage<float> whole(c, shardwise::stage_split(c.layers, 1), 0);  // one stage: tied as in Llama
  CHECK(whole.output->weight.size() == 0);                                     // computes with the embedding's table
}
