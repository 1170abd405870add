// Training resumed from a checkpoint with its optimizer state continues exactly as the uninterrupted run:
// dp 1 x tp 2 (plain AdamW) and dp 2 x tp 2 with ZeRO-1, on the thread mesh. Resumed at another dp x tp, with
// ZeRO-1 or without, it continues as the uninterrupted run within fp32's reduction order (the moments reshard as
// the parameters do). Saved asynchronously (sw::async_save) while training goes on, the same; a failed
// background write is raised on every rank. A checkpoint without the state is refused by name. A learning-rate
// schedule resumes on its curve. A MoeLlama's experts placed over ep ranks save and load at any other ep size.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cases/async_save_cases.hpp"
#include "cases/expert_checkpoint_cases.hpp"
#include "cases/llama_cases.hpp"

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;

namespace {
using Plan = models::llama_plan<true>;
using Model = models::Llama<float, Plan>;

/// `steps` training steps of `model` from step `first` (its batches); returns each step's loss, the whole batch's.
template <class Tp, class Dp>
std::vector<double> train_steps(Model& model, sw::AdamW<float>& optimizer, Tp const& tp, Dp const& dp, int first,
                                int steps, models::LlamaConfig const& c) {
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
    losses.push_back(sw::all_reduce(dp, result.loss, sw::Avg{}));  // the whole batch's
  }
  return losses;
}

sw::AdamWOptions<float> adamw_options(bool zero1) {
  return {.learning_rate = 3e-3f, .max_grad_norm = 1.0f, .zero1 = zero1};
}

struct Trainer {
  Model model;
  sw::AdamW<float> optimizer;
  Trainer(models::LlamaConfig const& c, bool zero1) : model(c), optimizer(adamw_options(zero1)) {}

  template <class Tp, class Dp>
  std::vector<double> train(Tp const& tp, Dp const& dp, int first, int steps, models::LlamaConfig const& c) {
    return train_steps(model, optimizer, tp, dp, first, steps, c);
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
    // The moments are tensors of the checkpoint, whole as their parameter (ZeRO-1's slices gathered).
    auto const index = sw::read_checkpoint_index(dir);
    for (std::string const name : {"layers.0.attention.wq.weight", "norm.weight"})
      for (std::string const suffix : {".exp_avg", ".exp_avg_sq"}) {
        INFO(name << suffix);
        REQUIRE(index.find("optimizer." + name + suffix) != nullptr);
        CHECK(index.find("optimizer." + name + suffix)->shape == index.find(name)->shape);
      }
    fs::remove_all(dir);
  }
}

// A learning-rate schedule is saved with the optimizer's state and restored by the load (as torch's
// LRScheduler.load_state_dict), so a run saved at step 40 of a warm-up + cosine over 60 and resumed by an optimizer
// made with the default (constant) schedule continues the curve: bit for bit the run that never stopped.
TEST_CASE("Checkpoint with optimizer state: a learning-rate schedule resumes on its curve, bit for bit") {
  auto c = llama_cases::small_config();
  c.kv_heads = 2;
  fs::path const dir = fs::temp_directory_path() / "shardwise_optimizer_ckpt_schedule";
  fs::remove_all(dir);
  sw::LearningRateSchedule const schedule{
      .kind = sw::schedule_kind::cosine, .warmup_steps = 10, .total_steps = 60, .min_lr_rate = 0.1};
  sw::run_threads(2, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, 2});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    auto options = adamw_options(false);
    options.schedule = schedule;
    Model straight_model(c);
    sw::AdamW<float> straight(options);
    sw::parallelize(straight_model, tp);
    train_steps(straight_model, straight, tp, dp, 0, 40, c);
    sw::save_sharded(straight_model, straight, tp, dp, dir, 40);
    auto const expected_losses = train_steps(straight_model, straight, tp, dp, 40, 20, c);

    Model resumed_model(c);
    sw::AdamW<float> resumed(adamw_options(false));  // the default schedule: the checkpoint's replaces it
    sw::parallelize(resumed_model, tp);
    sw::load_sharded(resumed_model, resumed, tp, dp, dir);
    CHECK(resumed.options().schedule == schedule);
    auto const losses = train_steps(resumed_model, resumed, tp, dp, 40, 20, c);
    CHECK(losses == expected_losses);
    CHECK(flat_parameters(resumed_model) == flat_parameters(straight_model));
    CHECK(resumed.learning_rate() == straight.learning_rate());

    // Resumed at a constant learning rate instead (the schedule set back after the load) the run differs.
    Model constant_model(c);
    sw::AdamW<float> constant(adamw_options(false));
    sw::parallelize(constant_model, tp);
    sw::load_sharded(constant_model, constant, tp, dp, dir);
    constant.set_schedule({});
    CHECK(train_steps(constant_model, constant, tp, dp, 40, 20, c) != expected_losses);
  });
  fs::remove_all(dir);
}

// Frozen parameters (sw::freeze) hold no optimizer state: the checkpoint keeps moments for the trained ones only,
// and a run resumed from it continues bit for bit, at dp 2 x tp 2 with ZeRO-1.
TEST_CASE("Checkpoint with optimizer state: frozen parameters have no moments, and the run resumes bit for bit") {
  auto c = llama_cases::small_config();
  c.kv_heads = 2;
  fs::path const dir = fs::temp_directory_path() / "shardwise_optimizer_ckpt_frozen";
  fs::remove_all(dir);
  std::vector<std::string> const frozen{"tok_embeddings.weight", "*norm.weight", "layers.0.*"};
  sw::run_threads(4, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    Trainer straight(c, true);
    sw::parallelize(straight.model, tp);
    sw::freeze(straight.model, frozen);
    straight.train(tp, dp, 0, 3, c);
    sw::save_sharded(straight.model, straight.optimizer, tp, dp, dir, 3);
    auto const expected_losses = straight.train(tp, dp, 3, 3, c);

    Trainer resumed(c, true);
    sw::parallelize(resumed.model, tp);
    sw::freeze(resumed.model, frozen);
    sw::load_sharded(resumed.model, resumed.optimizer, tp, dp, dir);
    CHECK(resumed.train(tp, dp, 3, 3, c) == expected_losses);
    CHECK(flat_parameters(resumed.model) == flat_parameters(straight.model));
  });
  auto const index = sw::read_checkpoint_index(dir);
  CHECK(index.find("layers.0.attention.wq.weight") != nullptr);  // the frozen values are saved
  CHECK(index.find("optimizer.layers.0.attention.wq.weight.exp_avg") == nullptr);
  CHECK(index.find("optimizer.norm.weight.exp_avg") == nullptr);
  CHECK(index.find("optimizer.layers.1.attention.wq.weight.exp_avg") != nullptr);
  fs::remove_all(dir);
}

namespace {
/// A dp x tp layout of the Llama model and its AdamW.
struct Layout {
  int dp, tp;
  bool zero1;
};

/// Trains `first` steps at `at` and saves with the optimizer state (`save`), or loads the state saved at another
/// layout (with the optimizer's state unless `model_only`); then trains `more` steps. Every rank returns those
/// steps' losses (the whole batch's) and every parameter whole.
template <class World>
llama_cases::Run resumable_run(World const& world, Layout const& at, models::LlamaConfig const& c, int first, int more,
                               fs::path const& dir, bool save, bool model_only = false) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {at.dp, at.tp});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  Trainer t(c, at.zero1);
  sw::parallelize(t.model, tp);
  if (save) {
    t.train(tp, dp, 0, first, c);
    sw::save_sharded(t.model, t.optimizer, tp, dp, dir, first);
  } else if (model_only) {
    sw::load_sharded(t.model, tp, dir);
  } else {
    CHECK(sw::load_sharded(t.model, t.optimizer, tp, dp, dir).step == first);
    CHECK(t.optimizer.steps() == std::size_t(first));
  }
  llama_cases::Run run;
  run.losses = t.train(tp, dp, first, more, c);
  run.parameters = llama_cases::whole_parameters(t.model);
  return run;
}

/// Parameters resumed at another layout against the run that never stopped (see the test case below).
double const resharded_tolerance = 1e-5;

/// The largest |got - expected| / (|expected| + rms of its tensor) over every parameter element.
double worst_parameter_error(llama_cases::Run const& got, llama_cases::Run const& expected) {
  double worst = 0;
  for (std::size_t t = 0; t < expected.parameters.size(); ++t) {
    auto const& a = got.parameters.at(t).values;
    auto const& b = expected.parameters[t].values;
    double squares = 0;
    for (float x : b) squares += double(x) * double(x);
    double const rms = std::sqrt(squares / double(std::max<std::size_t>(1, b.size())));
    for (std::size_t i = 0; i < b.size(); ++i)
      worst = std::max(worst, std::abs(double(a.at(i)) - double(b[i])) / (std::abs(double(b[i])) + rms));
  }
  return worst;
}
}  // namespace

// DCP's resharding: the moments are saved cut as their parameters, so a run resumes at another dp x tp, ZeRO-1 on
// or off. Against the run that never stopped, at the saving layout, for 3 steps: every loss within 1e-6 relative
// and every parameter within 1e-5 of (its size + its tensor's rms) — not bit for bit, as the gradients are fp32
// sums over other ranks, in another order (measured: 1.2e-7 to 1.5e-7 at worst). Resumed with the model alone
// (moments at zero, step 1 again) the parameters differ by 0.14: the check can fail.
TEST_CASE("Checkpoint with optimizer state resumes at another dp x tp and ZeRO-1 setting: the run that never stopped") {
  auto c = llama_cases::small_config();
  c.kv_heads = 2;  // at tp 4 each key-value head is held twice
  struct Pair {
    Layout saved, resumed;
    std::size_t vocabulary;
  };
  // The last pair's vocabulary (62) is padded to 64 at tp 4: the moments' padding rows are neither saved nor read.
  for (auto const& pair : {Pair{{2, 2, true}, {1, 4, false}, 64}, Pair{{4, 1, false}, {2, 2, true}, 64},
                           Pair{{1, 4, false}, {4, 1, true}, 64}, Pair{{2, 2, false}, {2, 1, true}, 64},
                           Pair{{2, 2, true}, {1, 4, true}, 62}}) {
    Layout const saved = pair.saved, resumed = pair.resumed;  // not bindings: clang 14 cannot capture those
    c.vocabulary = pair.vocabulary;
    INFO("saved at dp " << saved.dp << " x tp " << saved.tp << " (ZeRO-1 " << saved.zero1 << "), resumed at dp "
                        << resumed.dp << " x tp " << resumed.tp << " (ZeRO-1 " << resumed.zero1 << "), vocabulary "
                        << c.vocabulary);
    fs::path const dir = fs::temp_directory_path() / "shardwise_optimizer_resharded";
    fs::remove_all(dir);
    int const first = 3, more = 3;
    llama_cases::Run straight, continued, model_only;
    sw::run_threads(saved.dp * saved.tp, [&](auto& world) {
      auto run = resumable_run(world, saved, c, first, more, dir, true);
      if (world.rank() == 0) straight = std::move(run);
    });
    sw::run_threads(resumed.dp * resumed.tp, [&](auto& world) {
      auto run = resumable_run(world, resumed, c, first, more, dir, false);
      auto alone = resumable_run(world, resumed, c, first, more, dir, false, true);
      if (world.rank() == 0) continued = std::move(run), model_only = std::move(alone);
    });
    llama_cases::check_same_run(continued, straight, resharded_tolerance);
    for (std::size_t i = 0; i < straight.losses.size(); ++i)
      CHECK(std::abs(continued.losses[i] - straight.losses[i]) <= 1e-6 * straight.losses[i]);
    CHECK(worst_parameter_error(model_only, straight) > 100 * resharded_tolerance);
    MESSAGE("worst parameter error resumed with the state: " << worst_parameter_error(continued, straight)
                                                             << ", with the model alone: "
                                                             << worst_parameter_error(model_only, straight));
    fs::remove_all(dir);
  }
}

TEST_CASE("Checkpoint with optimizer state: a model declared with sw::Lazy resumes from it bit for bit") {
  auto c = llama_cases::small_config();
  c.kv_heads = 2;
  fs::path const dir = fs::temp_directory_path() / "shardwise_optimizer_ckpt_lazy";
  fs::remove_all(dir);
  sw::run_threads(4, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
    auto const tp = sw::submesh<"tp">(mesh);
    auto const dp = sw::submesh<"dp">(mesh);
    Trainer straight(c, true);
    sw::parallelize(straight.model, tp);
    straight.train(tp, dp, 0, 2, c);
    sw::save_sharded(straight.model, straight.optimizer, tp, dp, dir, 2);
    auto const expected = straight.train(tp, dp, 2, 2, c);
    sw::Lazy<Model> lazy(c);  // no parameter allocated until the load fills its shard
    sw::parallelize(lazy, tp);
    sw::AdamW<float> optimizer(adamw_options(true));
    sw::load_sharded(lazy.unmaterialized(), optimizer, tp, dp, dir);
    CHECK(train_steps(lazy.unmaterialized(), optimizer, tp, dp, 2, 2, c) == expected);
    CHECK(flat_parameters(lazy.unmaterialized()) == flat_parameters(straight.model));
  });
  fs::remove_all(dir);
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

TEST_CASE("Checkpoint with optimizer state: one of the model alone is refused with the reason") {
  auto const c = llama_cases::small_config();
  fs::path const dir = fs::temp_directory_path() / "shardwise_optimizer_ckpt_none";
  fs::remove_all(dir);
  sw::run_threads(2, [&](auto& world) {
    auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, 2});
    Trainer t(c, false);
    sw::parallelize(t.model, sw::submesh<"tp">(mesh));
    sw::save_sharded(t.model, sw::submesh<"tp">(mesh), dir, 0);
    CHECK_THROWS_WITH_AS(
        sw::load_sharded(t.model, t.optimizer, sw::submesh<"tp">(mesh), sw::submesh<"dp">(mesh), dir),
        doctest::Contains("holds no optimizer state (it was saved without the optimizer); load the model alone"),
        sw::error);
  });
  fs::remove_all(dir);
}

TEST_CASE("Checkpoint of experts placed over ep ranks: saved at ep 1, 2, 4 and 2 x tp 2, loaded at ep 1, 4 and back") {
  for (int ranks : {1, 2, 4}) {
    INFO("ranks " << ranks);
    fs::path const dir = fs::temp_directory_path() / ("shardwise_expert_ckpt_" + std::to_string(ranks));
    fs::remove_all(dir);
    sw::run_threads(ranks, [&](auto& world) { expert_checkpoint_cases::check_expert_checkpoints(world, dir); });
    fs::remove_all(dir);
  }
  fs::path const dir = fs::temp_directory_path() / "shardwise_expert_tp_ckpt";
  fs::remove_all(dir);
  sw::run_threads(4, [&](auto& world) { expert_checkpoint_cases::check_expert_tp_checkpoint(world, dir); });
  fs::remove_all(dir);
}
