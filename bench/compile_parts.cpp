// What each part of a one-plan training program costs to compile (bench/compile_time.sh --parts,
// docs/build-time.md): the Llama model in float under tensor + sequence parallelism, loaded from a save_pretrained
// folder, trained one step, saved sharded and reloaded, with the parts switched on one after another by
// -DSHARDWISE_PARTS=n. Each n adds one part to n - 1: 0 parses the headers, 1 launches, 2 makes the mesh, 3
// builds the model, 4 parallelizes it, 5 runs forward, 6 the loss and backward, 7 AdamW's step, 8
// load_pretrained, 9 the sharded save and load. Timed by that script only; CMake compiles it with every part (the
// object library bench_compile_parts), so that it keeps compiling.
#include <cstdint>
#include <filesystem>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/mesh/launch.hpp>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/models/llama_names.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <vector>

#ifndef SHARDWISE_PARTS
#define SHARDWISE_PARTS 9
#endif

namespace sw = shardwise;
namespace models = shardwise::models;

#if SHARDWISE_PARTS >= 2
template <class World>
void one_step(World& world, [[maybe_unused]] std::filesystem::path const& folder) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, world.size()});
  auto const tp = sw::submesh<"tp">(mesh);
  [[maybe_unused]] auto const dp = sw::submesh<"dp">(mesh);
#if SHARDWISE_PARTS >= 3
  auto const config = models::read_llama_config(folder / "config.json");
  models::Llama<float, models::llama_plan<true>> model(config);
#endif
#if SHARDWISE_PARTS >= 4
  sw::parallelize(model, tp);
#endif
#if SHARDWISE_PARTS >= 5
  std::vector<std::int64_t> const ids(config.sequence, 1);
  auto const logits = model.forward(ids);
#endif
#if SHARDWISE_PARTS >= 6
  auto const result = models::llama_loss(tp, logits, ids, config.vocabulary);
  model.backward(result.dlogits);
#endif
#if SHARDWISE_PARTS >= 7
  sw::AdamW<float> optimizer({.zero1 = true});
  optimizer.step(sw::finish_gradients(model), dp);
  sw::zero_grad(model);
#endif
#if SHARDWISE_PARTS >= 8
  sw::load_pretrained(model, tp, folder, sw::transformers_llama_mapping());
#endif
#if SHARDWISE_PARTS >= 9
  sw::save_sharded(model, optimizer, tp, dp, folder / "sharded", 1);
  sw::load_sharded(model, optimizer, tp, dp, folder / "sharded");
#endif
}
#endif

int main(int argc, char** argv) {
#if SHARDWISE_PARTS >= 1
  sw::launch(argc, argv, 2, [&](auto& world) {
#if SHARDWISE_PARTS >= 2
    one_step(world, argc > 1 ? argv[1] : "pretrained");
#else
    (void)world;
#endif
  });
#else
  (void)argc, (void)argv;
#endif
}
