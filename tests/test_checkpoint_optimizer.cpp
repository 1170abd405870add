// Training resumed from a checkpoint with its optimizer state continues exactly as the uninterrupted run:
// dp 1 x tp 2 (plain AdamW) and dp 2 x tp 2 with ZeRO-1 (one state file per dp rank), on the thread mesh.
// A checkpoint resumed at another dp size under ZeRO-1 is refused with the sizes.
#include <doctest/doctest.h>

#include <filesystem>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "cases/llama_cases.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {
using Plan = models::llama_plan<true>;
using Model = models::Llama<float, Plan>;

struct Trainer {
  Model model;
  sw::AdamW<float> optimizer;
  Trainer(models::LlamaConfig const& c, bool zero1)
      : model(c), optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f, .zero1 = zero1}) {}

  template <class Tp, class Dp>
  std::vector<double> train(Tp const& tp, Dp const& dp, int first, int steps, models::LlamaConfig const& c) {
    std::vector<double> losses;
    std::vector<std::int64_t> ids, targets;
    int const per_rank = 4 / dp.size();
    for (int step = first; step < first + steps; ++step) {
      llama_cases::batch(c, step, 4, dp.rank() * per_rank, per_rank, ids, targets);
      auto const logits = model.forward(ids);
      auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
      model.backward(result.dlogits);
      optimizer.step(sw::finish_gradients(model), dp);
      sw::zero_grad(model);
      losses.push_back(result.loss);
    }
    return losses;
  }
};

std::vector<float> flat_parameters(Model& model) {
  std::vector<float> all;
  sw::detail::for_each_parameter(
      model, [&](auto const& p) { all.insert(all.end(), p.value->data(), p.value->data() + p.value->size()); });
  return all;
}
}  // namespace

TEST_CASE("Checkpoint with optimizer state: resuming equals the uninterrupted run") {
  auto c = llama_cases::small_config();
  c.kv_heads = 2;
  for (auto const& setting : {std::pair{1, false}, std::pair{2, true}, std::pair{2, false}}) {
    int const dp_size = setting.first;  // not a structured binding: doctest's INFO captures it in a lambda
    bool const zero1 = setting.second;
    INFO("dp " << dp_size << " x tp 2, ZeRO-1 " << zero1);
    fs::path const dir =
        fs::temp_directory_path() / ("shardwise_optimizer_ckpt_" + std::to_string(dp_size) + (zero1 ? "_zero1" : ""));
    fs::remove_all(dir);
    sw::run_threads(2 * dp_size, [&](auto& world) {
      auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, 2});
      auto const tp = sw::submesh<"tp">(mesh);
      auto const dp = sw::submesh<"dp">(mesh);
      Trainer straight(c, zero1);
      sw::parallelize(straight.model, tp);
      straight.train(tp, dp, 0, 4, c);
      sw::save_sharded(straight.model, straight.optimizer, tp, dp, dir, 4);
      auto const expected_losses = straight.train(tp, dp, 4, 4, c);

      Trainer resumed(c, zero1);
      sw::parallelize(resumed.model, tp);
      sw::load_sharded(resumed.model, resumed.optimizer, tp, dp, dir);
      CHECK(resumed.optimizer.steps() == 4);
      auto const losses = resumed.train(tp, dp, 4, 4, c);
      CHECK(losses == expected_losses);  // same arithmetic in the same order: bit for bit
      CHECK(flat_parameters(resumed.model) == flat_parameters(straight.model));

      // Without the optimizer state (moments at zero, step 1 again) the run differs: the test can tell.
      Trainer fresh(c, zero1);
      sw::parallelize(fresh.model, tp);
      sw::load_sharded(fresh.model, tp, dir);
      auto const fresh_losses = fresh.train(tp, dp, 4, 4, c);
      CHECK(fresh_losses != expected_losses);
    });
    if (dp_size == 2)
      CHECK(fs::exists(dir / "tensor_parallel_shards/dp_rank_01_tp_rank_01_pp_rank_00/optimizer.safetensors") == zero1);
    CHECK(fs::exists(dir / "tensor_parallel_shards/dp_rank_00_tp_rank_01_pp_rank_00/optimizer.safetensors"));
    fs::remove_all(dir);
  }
}

TEST_CASE("Checkpoint with optimizer state: another dp size, or none saved, is refused with the reason") {
  auto const c = llama_cases::small_config();
  fs::path const dir = fs::temp_directory_path() / "shardwise_optimizer_ckpt_dp_mismatch";
  fs::remove_all(dir);
  sw::run_threads(4, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
    Trainer t(c, true);
    sw::parallelize(t.model, sw::submesh<"tp">(mesh));
    t.train(sw::submesh<"tp">(mesh), sw::submesh<"dp">(mesh), 0, 1, c);
    sw::save_sharded(t.model, t.optimizer, sw::submesh<"tp">(mesh), sw::submesh<"dp">(mesh), dir, 1);
  });
  sw::run_threads(2, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, 2});
    Trainer t(c, false);
    sw::parallelize(t.model, sw::submesh<"tp">(mesh));
    CHECK_THROWS_WITH_AS(sw::load_sharded(t.model, t.optimizer, sw::submesh<"tp">(mesh), sw::submesh<"dp">(mesh), dir),
                         doctest::Contains("optimizer state saved at tp 2, dp 2 (ZeRO-1 1) cannot resume at tp 2, dp 1 "
                                           "(ZeRO-1 0)"),
                         sw::error);
  });
  fs::remove_all(dir);
  // A checkpoint of the model alone has no optimizer state to resume.
  sw::run_threads(2, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, 2});
    Trainer t(c, false);
    sw::parallelize(t.model, sw::submesh<"tp">(mesh));
    sw::save_sharded(t.model, sw::submesh<"tp">(mesh), dir, 0);
    CHECK_THROWS_WITH_AS(sw::load_sharded(t.model, t.optimizer, sw::submesh<"tp">(mesh), sw::submesh<"dp">(mesh), dir),
                         doctest::Contains("has no optimizer state for dp rank 0, tp rank "), sw::error);
  });
  fs::remove_all(dir);
}
