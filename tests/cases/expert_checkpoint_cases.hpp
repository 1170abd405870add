// Checkpoints of experts placed over ep ranks: a MoeLlama trained with its 8 experts over ep = every rank (the
// data-parallel ranks), saved with its AdamW state by every ep rank, loads into the unplaced model (ep 1) with
// equal logits and the same optimizer state, bit for bit, and both then take the same next step; saved from that
// unplaced model, it loads back at ep = every rank the same way, into a model declared with sw::Lazy and placed
// before any parameter exists. The experts are named by their index in the whole model, so any ep size reads any
// other's save; on 4 ranks, experts placed over dp 2 and cut over tp 2 load at ep 4 and at ep 1 x pp 2. Written
// once for threads and MPI; fp64.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <shardwise/checkpoint/optimizer_state.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/nn/lazy.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <utility>
#include <vector>

#include "expert_parallel_cases.hpp"

namespace expert_checkpoint_cases {
namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;
using M = sw::nn::matrix<double>;
using Model = models::MoeLlama<double>;

/// Each trained parameter's first and second moments on this rank, by the parameter's name.
template <class Any, class Dp>
std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> moments_by_name(Any& model,
                                                                                           sw::AdamW<double>& optimizer,
                                                                                           Dp const& dp) {
  std::vector<std::string> names;
  sw::for_each_parameter(model, [&](std::string const& name, auto const&) { names.push_back(name); });
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> moments;
  optimizer.for_each_state(model, dp, [&](std::size_t index, std::size_t, std::span<double> m, std::span<double> v) {
    moments[names.at(index)] = {{m.begin(), m.end()}, {v.begin(), v.end()}};
  });
  return moments;
}

/// Whether every moment `part` holds (a placed model's: its own experts and the rest) equals `whole`'s, exactly.
inline bool same_moments(std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> const& part,
                         std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> const& whole) {
  for (auto const& entry : part) {
    std::string const& name = entry.first;
    auto const& mv = entry.second;
    auto const found = whole.find(name);
    if (found == whole.end() || found->second != mv) {
      MESSAGE("moments differ or are missing: " << name);
      return false;
    }
  }
  return !part.empty();
}

template <class World>
void check_expert_checkpoints(World const& world, fs::path const& dir) {
  int const ranks = world.size(), me = world.rank();
  models::MoeConfig m = expert_parallel_cases::config();
  m.shared_expert_hidden = 0;
  models::LlamaConfig const c = expert_parallel_cases::model_config(m, 11),
                            other = expert_parallel_cases::model_config(m, 12);
  auto const ids = [](int step, int q, bool targets) {
    std::vector<std::int64_t> v;
    for (int i = 0; i < 4 * (q + 1); ++i) v.push_back((step * 5 + q * 7 + i * 3 + (targets ? 1 : 0)) % 20);
    return v;
  };
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(world, {ranks});
  auto const train = [&](Model& model, sw::AdamW<double>& optimizer, int step) {
    auto result = models::llama_loss(tp, model.forward(ids(step, me, false)), ids(step, me, true), c.vocabulary);
    model.backward(result.dlogits);
    (void)optimizer.step(sw::finish_gradients(model), dp);
    sw::zero_grad(model);
    return result.loss + m.router_aux_loss_coef * model.router_aux_loss();
  };
  sw::AdamWOptions<double> const options{.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 0.5};
  Model placed(c), whole(other);
  sw::Lazy<Model> lazy(other);  // placed before any parameter exists: each rank allocates its own experts only
  (void)sw::expert_parallelize(placed, dp);
  sw::AdamW<double> placed_step(options), whole_step(options), back_step(options);
  for (int step = 0; step < 2; ++step) (void)train(placed, placed_step, step);

  sw::save_sharded(placed, placed_step, tp, dp, dir / "ep", 2);   // every ep rank writes its experts
  (void)sw::load_sharded(whole, whole_step, tp, dp, dir / "ep");  // each rank reads them all
  CHECK(whole_step.steps() == 2);
  CHECK((placed.forward(ids(5, me, false)).local - whole.forward(ids(5, me, false)).local).cwiseAbs().maxCoeff() <
        1e-13);
  CHECK(same_moments(moments_by_name(placed, placed_step, dp), moments_by_name(whole, whole_step, dp)));
  double const next = train(placed, placed_step, 2);
  CHECK(next == doctest::Approx(train(whole, whole_step, 2)).epsilon(1e-12));

  sw::save_sharded(whole, whole_step, tp, dp, dir / "ep1", 3);  // unplaced: dp rank 0 writes it all
  (void)sw::expert_parallelize(lazy, dp);
  Model& back = sw::materialize(lazy);
  CHECK(back.layers[0].feed_forward.experts.size() == 8 / std::size_t(ranks));
  (void)sw::load_sharded(back, back_step, tp, dp, dir / "ep1");  // each rank reads its own experts
  CHECK((back.forward(ids(6, me, false)).local - whole.forward(ids(6, me, false)).local).cwiseAbs().maxCoeff() < 1e-13);
  CHECK(same_moments(moments_by_name(back, back_step, dp), moments_by_name(whole, whole_step, dp)));
  CHECK(train(back, back_step, 3) == doctest::Approx(train(whole, whole_step, 3)).epsilon(1e-12));

  CHECK_THROWS_WITH_AS(sw::save_sharded(back, tp, dir / "alone", 0),
                       "shardwise::save_sharded: the model's experts are placed over ep ranks "
                       "(sw::expert_parallelize), each rank holding its own; save it with its optimizer on every "
                       "data-parallel (ep) rank: save_sharded(model, optimizer, tp, dp, dir, step)",
                       sw::error);
}

/// On 4 ranks: a MoeLlama with its experts placed over dp 2 and each cut over tp 2 (moe_llama_plan<true, true>),
/// trained 2 steps and saved with its state, loads with its experts over ep 4 at tp 1: the same logits (the tp ranks'
/// vocabulary shards gathered), and each moment of a parameter both hold the same, bit for bit (a tp shard of an
/// expert's w1 is a run of its rows); and into a pipeline of two MoeLlamaStage at ep 1 the same way.
template <class World>
void check_expert_tp_checkpoint(World const& world, fs::path const& dir) {
  REQUIRE(world.size() == 4);
  models::MoeConfig m = expert_parallel_cases::config();
  m.expert_hidden = 6;
  models::LlamaConfig c = expert_parallel_cases::model_config(m, 13),
                      other = expert_parallel_cases::model_config(m, 14);
  c.kv_heads = other.kv_heads = 2;
  auto const ids = [](int step, int q, bool targets) {
    std::vector<std::int64_t> v;
    for (int i = 0; i < 4 * (q + 1); ++i) v.push_back((step * 5 + q * 7 + i * 3 + (targets ? 1 : 0)) % 20);
    return v;
  };
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
  auto const dp = sw::submesh<"dp">(mesh);
  auto const tp = sw::submesh<"tp">(mesh);
  sw::AdamWOptions<double> const options{.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 0.5};
  models::MoeLlama<double, models::moe_llama_plan<true, true>> cut(c);
  sw::parallelize(cut, tp);
  (void)sw::expert_parallelize(cut, dp);
  sw::AdamW<double> cut_step(options);
  for (int step = 0; step < 2; ++step) {
    auto result = models::llama_loss(tp, cut.forward(ids(step, dp.rank(), false)), ids(step, dp.rank(), true), 20);
    cut.backward(result.dlogits);
    (void)cut_step.step(sw::finish_gradients(cut), dp);
    sw::zero_grad(cut);
  }
  sw::save_sharded(cut, cut_step, tp, dp, dir / "ep2_tp2", 2);

  auto const alone = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const ep = sw::make_mesh<"dp">(world, {4});
  Model wide(other);
  (void)sw::expert_parallelize(wide, ep);
  sw::AdamW<double> wide_step(options);
  (void)sw::load_sharded(wide, wide_step, alone, ep, dir / "ep2_tp2");
  CHECK(wide_step.steps() == 2);
  M gathered;  // every rank the same rows, so that both models' exchanges see the same tokens
  sw::all_gather(tp, cut.forward(ids(5, 1, false)).local, gathered, -1);
  CHECK((gathered - wide.forward(ids(5, 1, false)).local).cwiseAbs().maxCoeff() < 1e-13);

  auto const mine = moments_by_name(cut, cut_step, dp);
  auto const compare_moments = [&](auto const& theirs) {  // the moments both layouts hold, bit for bit
    std::size_t compared = 0;
    for (auto const& entry : theirs) {  // not a structured binding: clang 14 cannot capture one in INFO
      std::string const& name = entry.first;
      auto const& mv = entry.second;
      auto const found = mine.find(name);
      if (found == mine.end()) continue;  // an expert the other layout holds elsewhere
      bool const cut_rows = name.find(".experts.") != std::string::npos && name.ends_with(".w1.weight");
      if (!cut_rows && found->second.first.size() != mv.first.size()) continue;  // cut another way: w2, attention
      std::size_t const shard = found->second.first.size(), from = cut_rows ? shard * std::size_t(tp.rank()) : 0;
      INFO(name);
      CHECK(std::equal(found->second.first.begin(), found->second.first.end(), mv.first.begin() + long(from)));
      CHECK(std::equal(found->second.second.begin(), found->second.second.end(), mv.second.begin() + long(from)));
      ++compared;
    }
    return compared;
  };
  CHECK(compare_moments(moments_by_name(wide, wide_step, ep)) > 4);

  // At ep 1 x pp 2 (two replicas of a pipeline of two stages): each stage reads its blocks with all their experts.
  auto const staged = sw::make_mesh<"dp", "pp">(world, {2, 2});
  auto const pp = sw::submesh<"pp">(staged);
  auto const replicas = sw::submesh<"dp">(staged);
  using Stage = models::MoeLlamaStage<double>;
  Stage stage(other, sw::stage_split(other.layers, 2), pp.rank());
  sw::AdamW<double> stage_step(options);
  (void)sw::load_sharded(stage, stage_step, alone, replicas, dir / "ep2_tp2");
  CHECK(stage_step.steps() == 2);
  CHECK(stage.layers[0].feed_forward.experts.size() == 8);
  if (stage.is_first()) {
    sw::send(pp, stage.forward(ids(5, 1, false)).local, 1);
  } else {
    M h;
    sw::recv(pp, h, 0);
    M const logits = (*stage.output)((*stage.norm)(stage.forward(typename Stage::stream{std::move(h)}))).local;
    CHECK((gathered - logits).cwiseAbs().maxCoeff() < 1e-13);
  }
  CHECK(compare_moments(moments_by_name(stage, stage_step, replicas)) > 4);

  // Not built, refused by name on every rank: saves of placed stages, and of experts placed with replicas.
  (void)sw::expert_parallelize(stage, replicas);
  CHECK_THROWS_WITH_AS(sw::save_sharded(stage, stage_step, alone, pp, replicas, dir / "unused", 0),
                       doctest::Contains("the stage's experts are placed over ep ranks (sw::expert_parallelize), "
                                         "whose saves of pipeline stages are not built yet"),
                       sw::error);
  auto const layout = sw::make_mesh<"edp", "ep">(world, {2, 2});
  Model drawn(other);
  (void)sw::expert_parallelize(drawn, sw::submesh<"ep">(layout), sw::submesh<"edp">(layout));
  CHECK_THROWS_WITH_AS(sw::save_sharded(drawn, wide_step, alone, ep, dir / "unused", 0),
                       doctest::Contains("placed over ep ranks with replicas (sw::expert_parallelize(model, ep, "
                                         "replicas)), whose saves are not built yet"),
                       sw::error);
}

}  // namespace expert_checkpoint_cases
