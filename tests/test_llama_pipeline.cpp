// The Llama model trained in pipeline stages on the thread mesh at 1, 2 and 4 ranks, with tp and dp beside the
// pipeline at 4, with FSDP within the stages at pp 2 x dp 2, and with the sequences cut over cp under FSDP and
// within stages; a MoeLlama's stages with their experts over the dp ranks; against the unsharded run
// (cases/llama_pipeline_cases.hpp, cases/llama_context_composed_cases.hpp, cases/moe_pipeline_cases.hpp).
#include <doctest/doctest.h>

#include <cmath>
#include <span>

#include "cases/llama_context_composed_cases.hpp"
#include "cases/llama_pipeline_cases.hpp"
#include "cases/moe_pipeline_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("Llama in pipeline stages: loss curves and parameters equal the unsharded run, thread mesh") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    worlds::run_threads(ranks,
                        [&](auto& world) { llama_pipeline_cases::check_all(world, llama_pipeline_cases::steps()); });
  }
}

TEST_CASE("MoeLlama in pipeline stages with experts over the dp ranks: equal to the unsharded run, thread mesh") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    worlds::run_threads(ranks, [&](auto& world) { moe_pipeline_cases::check_all(world); });
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
  // ZBV's V placement puts the first and last of 2 x 2 stages on rank 0: refused there too.
  models::LlamaStage<float> first_of_four(c, shardwise::stage_split(c.layers, 4), 0);
  worlds::run_threads(2, [&](auto& world) {
    auto const pp = shardwise::make_mesh<"pp">(world, {2});
    if (pp.rank() == 0)
      CHECK_THROWS_WITH_AS(
          first_of_four.shardwise_after_pipeline_step(pp, shardwise::shape_of<shardwise::ZeroBubbleV>(2, 1)),
          doctest::Contains("or ZeroBubbleV's V placement) is not supported"), shardwise::error);
  });
}

TEST_CASE("Llama in pipeline stages under FSDP: equal to the unsharded run, thread mesh") {
  worlds::run_threads(
      4, [&](auto& world) { llama_pipeline_cases::check_all_sharded(world, llama_pipeline_cases::steps()); });
}

TEST_CASE("FSDP within pipeline stages: the stages' span after fully_shard, and unreduced gradients, are refused") {
  namespace sw = shardwise;
  using llama_pipeline_cases::Setup;
  worlds::run_threads(2, [&](auto& world) {
    Setup const s{.dp = 2, .pp = 1, .microbatches = 2};
    auto const mesh = sw::make_mesh<"dp", "pp", "tp">(world, {2, 1, 1});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const pp = sw::submesh<"pp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    auto stage = llama_pipeline_cases::make_stages<sw::serial_plan>(s, pp);
    sw::parallelize(stage, tp);
    auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(stage, dp);
    llama_pipeline_cases::microbatch_feed<decltype(stage), decltype(tp)> feed{stage, tp, s, dp.rank()};
    feed.load(0);
    // The span of the stages: their parameters are freed between the units' calls.
    CHECK_THROWS_WITH_AS(
        sw::run_pipeline_step(sw::GPipe{}, pp, std::span(stage), 2, feed.input(), feed.loss_gradient()),
        doctest::Contains("pass the sharded model itself"), sw::error);
    // Without gradient sync the step leaves whole gradients unreduced: the optimizer refuses the shards.
    sw::AdamW<float> optimizer({.learning_rate = 3e-3f});
    sharded.set_requires_gradient_sync(false);
    sw::run_pipeline_step(sw::GPipe{}, pp, sharded, 2, feed.input(), feed.loss_gradient());
    CHECK_THROWS_WITH_AS(optimizer.step(sharded, pp), doctest::Contains("were not reduced over data parallelism"),
                         sw::error);
    // With it on again, the next step reduces what both steps accumulated, and the optimizer steps.
    sharded.set_requires_gradient_sync(true);
    sw::run_pipeline_step(sw::GPipe{}, pp, sharded, 2, feed.input(), feed.loss_gradient());
    CHECK(std::isfinite(optimizer.step(sharded, pp)));
  });
}

/// A last stage whose head (a module of its own) holds a copy of the first stage's table.
struct TiedHead {
  shardwise::Linear<float> proj{8, 4, 1};
  SHARDWISE_CHILDREN(proj)
};
struct LastStage {
  TiedHead head;
  SHARDWISE_CHILDREN(head)
};

TEST_CASE("FSDP within pipeline stages: a tied table's copy outside the root unit is refused, naming both") {
  namespace sw = shardwise;
  LastStage stage;
  stage.head.proj.mirror_weight_of("tok_embeddings.weight");
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  using head_unit = sw::fsdp_policy<sw::full_shard, sw::wrap_type<TiedHead>>;  // its gradients freed per backward
  CHECK_THROWS_WITH_AS((void)sw::fully_shard<head_unit>(stage, dp),
                       doctest::Contains("\"head.proj.weight\" is a pipeline stage's copy of a weight tied across "
                                         "stages, but it lies in the unit \"head\""),
                       sw::error);
  using blocks_only = sw::fsdp_policy<sw::full_shard, sw::wrap_none>;  // in the root unit: taken
  CHECK_NOTHROW((void)sw::fully_shard<blocks_only>(stage, dp));
}

TEST_CASE(
    "LlamaStage under cp: a split of another sequence length is refused; the first stage takes pieces; Llama under cp "
    "does not decode") {
  namespace models = shardwise::models;
  auto const c = llama_pipeline_cases::config();  // sequences of 8
  models::LlamaStage<float> first(c, shardwise::stage_split(c.layers, 2), 0);
  worlds::run_threads(2, [&](auto& world) {
    auto const cp = shardwise::make_mesh<"cp">(world, {2});
    auto copy = first;
    CHECK_THROWS_WITH_AS(shardwise::context_parallelize(copy, cp, {9, 2}),
                         doctest::Contains("the context_split cuts sequences of 9 tokens but the model's are 8"),
                         shardwise::error);
    (void)shardwise::context_parallelize(copy, cp, {8, 2});  // 4 tokens of each sequence here
    std::vector<std::int64_t> const six(6, 1);               // neither sequences of 8 nor 4-token pieces
    CHECK_THROWS_WITH_AS((void)copy.forward(six),
                         doctest::Contains("6 token ids are not whole sequences of 4 (this cp rank's tokens"),
                         shardwise::error);
    // The whole model cut over cp does not decode: a cached forward is refused.
    models::Llama<float> model(c);
    (void)shardwise::context_parallelize(model, cp, {8, 2});
    shardwise::kv_cache<float> cache(model.shardwise_kv_shape(), 1, 8);
    std::vector<std::int64_t> const prompt(3, 1);
    std::vector<std::size_t> const first{0}, three{3};
    CHECK_THROWS_WITH_AS((void)model.forward(prompt, cache.append(first, three), cache),
                         doctest::Contains("a forward with a key-value cache on a model cut over cp"),
                         shardwise::error);
  });
}

TEST_CASE("Llama cut over cp under FSDP and within pipeline stages: equal to the unsharded run, thread mesh") {
  for (int ranks : {2, 4})
    worlds::run_threads(
        ranks, [&](auto& world) { llama_context_composed_cases::check_all(world, llama_pipeline_cases::steps()); });
}
