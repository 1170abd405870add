// Training resumed from a checkpoint with its optimizer state continues exactly as the uninterrupted run:
// dp 1 x tp 2 (plain AdamW) and dp 2 x tp 2 with ZeRO-1 (one state file per dp rank), on the thread mesh.
// A checkpoint resumed at another dp size under ZeRO-1 is refused with the sizes. Saved asynchronously
// (sw::async_save) while training goes on, the same; a failed background write is raised on every rank.
#include <doctest/doctest.h>

#include <filesystem>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cases/async_save_cases.hpp"
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

TEST_CASE("Checkpoint with optimizer state saved asynchronously: resuming equals the run that went on meanwhile") {
  auto c = llama_cases::small_config();
  c.kv_heads = 2;
  for (auto const& setting : {std::pair{1, false}, std::pair{2, true}}) {
    int const dp_size = setting.first;
    bool const zero1 = setting.second;
    INFO("dp " << dp_size << " x tp 2, ZeRO-1 " << zero1);
    fs::path const dir = fs::temp_directory_path() / ("shardwise_optimizer_async_" + std::to_string(dp_size));
    fs::remove_all(dir);
    sw::run_threads(2 * dp_size, [&](auto& world) {
      auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, 2});
      auto const tp = sw::submesh<"tp">(mesh);
      auto const dp = sw::submesh<"dp">(mesh);
      Trainer straight(c, zero1);
      sw::parallelize(straight.model, tp);
      straight.train(tp, dp, 0, 4, c);
      sw::async_save saver;
      sw::save_sharded(straight.model, straight.optimizer, tp, dp, dir, 4, saver);
      CHECK(saver.pending());  // on every rank, the writing replica's and the others
      auto const expected_losses = straight.train(tp, dp, 4, 4, c);  // while dp rank 0 writes
      saver.wait();
      CHECK(!saver.pending());

      Trainer resumed(c, zero1);
      sw::parallelize(resumed.model, tp);
      sw::load_sharded(resumed.model, resumed.optimizer, tp, dp, dir);
      CHECK(resumed.optimizer.steps() == 4);
      auto const losses = resumed.train(tp, dp, 4, 4, c);
      CHECK(losses == expected_losses);
      CHECK(flat_parameters(resumed.model) == flat_parameters(straight.model));

      // A second save through the same saver, committed by poll() on every rank of dp x tp.
      sw::save_sharded(straight.model, straight.optimizer, tp, dp, dir, 8, saver);
      while (!saver.poll()) std::this_thread::yield();
      Trainer again(c, zero1);
      sw::parallelize(again.model, tp);
      CHECK(sw::load_sharded(again.model, again.optimizer, tp, dp, dir).step == 8);
      CHECK(flat_parameters(again.model) == flat_parameters(straight.model));
    });
    fs::remove_all(dir);
  }
}

TEST_CASE("Checkpoint with optimizer state saved asynchronously: a failed write is raised on every dp x tp rank") {
  auto const c = llama_cases::small_config();
  fs::path const root = fs::temp_directory_path() / "shardwise_optimizer_async_failure";
  fs::remove_all(root);
  fs::create_directories(root);
  fs::path const dir = root / "ckpt";
  async_cases::gated const gate(dir, 1);  // tp rank 1 of the writing replica cannot create its rank folder
  sw::run_threads(4, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    Trainer t(c, true);
    sw::parallelize(t.model, tp);
    t.train(tp, dp, 0, 1, c);
    sw::async_save saver;
    async_cases::arm(tp);
    sw::save_sharded(t.model, t.optimizer, tp, dp, dir, 1, saver);
    if (dp.rank() == 0) {
      REQUIRE(async_cases::wait_until_begun(tp.rank()));
      async_cases::release(tp.rank());
    }
    std::string message;
    try {
      saver.wait();
    } catch (sw::error const& e) {
      message = e.what();
    }
    INFO(message);
    CHECK(message.find("while writing the rank's shard in the background); the previous checkpoint is unchanged") !=
          std::string::npos);
    CHECK(message.find(sw::rank_folder(1, 0)) != std::string::npos);
    CHECK(!saver.pending());
  });
  CHECK(!fs::exists(dir / sw::checkpoint_index_name));
  fs::remove_all(root);
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
