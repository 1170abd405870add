#pragma once
// Sequences of any length, and documents packed into one row (sw::sequence_lengths), with a sliding window on
// the second layer, in fp64:
// - a packed row's logits and gradients equal each document's run alone (each attends within itself, its
//   positions from 0);
// - tensor parallelism with and without sequence parallelism (rows cut across tp whatever their lengths, 15 tokens
//   on 2 or 4 ranks) equals the unsharded run: logits, gradients, and 5 AdamW steps over packed rows whose
//   documents change every step;
// - FSDP at dp 2 (full shard) equals the unsharded run over both ranks' rows;
// - pipeline stages (pp 2, two packed microbatches a step, 1F1B and zero-bubble H1, activations kept or recomputed)
//   equal the unsharded run over both microbatches' rows;
// - a packed row cut over cp 2 and 4 (balanced; ring, and all-to-all where the heads divide) equals the unsharded
//   run on it.
// Tolerances: 1e-12 relative for one forward and backward, 1e-10 after 5 steps (fp64; what differs is the order
// of fp64 sums).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <shardwise/context.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
#include <string>
#include <vector>

namespace llama_packed_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using matrix = sw::nn::matrix<double>;

/// A Qwen2-like config (biases on q, k and v, grouped-query heads, tied, llama3 rotary scaling) whose capacity
/// (config.sequence) is longer than any document, with a sliding window of 4 on its second layer (Qwen2's
/// max_window_layers 1), shorter than most documents.
inline models::LlamaConfig config() {
  models::LlamaConfig c;
  c.vocabulary = 64, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 32;
  c.attention_bias = true, c.tie_word_embeddings = true, c.sliding_window = 4, c.first_window_layer = 1;
  c.rope_scaling = {.type = models::rope_type::llama3, .factor = 8, .original_max_positions = 16};
  return c;
}

/// A Qwen3-like config: q and k norms over heads of 16 on a width of 32 (wq 32 -> 64), biases on the four
/// attention projections, untied; at tp 4 each of the 2 key-value heads is repeated (with its norm's gradient
/// summed over the copies).
inline models::LlamaConfig qwen3_config() {
  models::LlamaConfig c = config();
  c.qk_norm = true, c.explicit_head_dim = 16, c.attention_output_bias = true, c.tie_word_embeddings = false;
  c.sliding_window = 0, c.first_window_layer = 0, c.rope_scaling = {}, c.rope_theta = 1e6;
  return c;
}

/// The configs every case runs on.
inline std::vector<models::LlamaConfig> configs() { return {config(), qwen3_config()}; }

/// The documents of step `step`: 15 tokens in three documents whose lengths change with the step.
inline std::vector<std::size_t> documents(int step) {
  std::vector<std::vector<std::size_t>> const each = {{5, 7, 3}, {1, 13, 1}, {9, 2, 4}, {15}, {3, 3, 9}};
  return each[static_cast<std::size_t>(step) % each.size()];
}

/// Token ids (or targets) of step `step`, `count` of them from token `first`.
inline std::vector<std::int64_t> tokens(int step, bool targets, std::size_t first = 0, std::size_t count = 15) {
  std::vector<std::int64_t> ids;
  for (std::size_t i = first; i < first + count; ++i)
    ids.push_back(static_cast<std::int64_t>((std::size_t(step) * 29 + i * 11 + (targets ? 5 : 0)) % 64));
  return ids;
}

/// What a run gives: the first batch's logits (whole) and finished gradients (whole, in parameter order), the
/// losses of its steps, and the parameters after them.
struct Result {
  matrix logits;
  std::vector<matrix> gradients;
  std::vector<double> losses;
  std::vector<matrix> parameters;
  std::vector<std::string> names;  // the parameters' (train_packed_fsdp, train_packed_pipeline)
};

template <class Mesh, class Logits>
matrix whole_logits(Mesh const& tp, Logits const& logits) {
  matrix whole = logits.local;
  if constexpr (!std::is_same_v<typename std::remove_cvref_t<Logits>::placement, sw::Replicate>)
    sw::all_gather(tp, logits.local, whole, -1);  // vocabulary-sharded logits, whole
  return whole;
}

/// `steps` AdamW steps over packed rows at TP = world size with Plan (the loss: the mean over the row's tokens).
template <class Plan, class World>
Result train_packed(World const& world, models::LlamaConfig const& c, int steps) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::Llama<double, Plan> model(c);
  sw::parallelize(model, tp);
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0});
  Result r;
  for (int step = 0; step < steps; ++step) {
    auto const logits = model.forward(tokens(step, false), sw::sequence_lengths(documents(step)));
    auto const loss = models::llama_loss(tp, logits, tokens(step, true), c.vocabulary);
    model.backward(loss.dlogits);
    auto finished = sw::finish_gradients(model);
    if (step == 0) {
      r.logits = whole_logits(tp, logits);
      sw::for_each_parameter(finished,
                             [&](std::string const&, auto const& p) { r.gradients.push_back(sw::full_gradient(p)); });
    }
    optimizer.step(finished, dp);
    sw::zero_grad(model);
    r.losses.push_back(loss.loss);
  }
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { r.parameters.push_back(sw::full_tensor(p)); });
  return r;
}

/// The first batch document by document on one rank: each document's logits from a forward of it alone, and the
/// gradients of the packed row's mean loss accumulated over the documents' backwards (each scaled by its share).
inline Result each_document_alone(models::LlamaConfig const& c) {
  auto const world = sw::serial_world();
  auto const tp = sw::make_mesh<"tp">(world, {1});
  models::Llama<double> model(c);
  sw::parallelize(model, tp);
  Result r;
  r.logits.resize(15, c.vocabulary);
  std::size_t first = 0;
  for (std::size_t n : documents(0)) {
    auto const logits = model.forward(tokens(0, false, first, n), sw::sequence_lengths{n});
    r.logits.middleRows(Eigen::Index(first), Eigen::Index(n)) = logits.local;
    auto loss = models::llama_loss(tp, logits, tokens(0, true, first, n), c.vocabulary);
    loss.dlogits.local *= double(n) / 15.0;  // the packed loss is the mean over all 15 tokens
    model.backward(loss.dlogits);
    first += n;
  }
  auto finished = sw::finish_gradients(model);
  sw::for_each_parameter(finished,
                         [&](std::string const&, auto const& p) { r.gradients.push_back(sw::full_gradient(p)); });
  return r;
}

inline double relative_error(matrix const& got, matrix const& expected) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) return INFINITY;
  return (got - expected).cwiseAbs().maxCoeff() / std::max(expected.cwiseAbs().maxCoeff(), 1e-300);
}

inline void check_same(std::vector<matrix> const& got, std::vector<matrix> const& expected, double tolerance,
                       char const* what) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(what << " " << i);
    CHECK(relative_error(got[i], expected[i]) <= tolerance);
  }
}

/// Row `row` of step `step`: the step's documents (rotated by the row) over token ids of their own.
inline void packed_row(int step, int row, std::vector<std::int64_t>& ids, std::vector<std::int64_t>& targets,
                       std::vector<std::size_t>& lengths) {
  auto const here = documents(step + row);
  lengths.insert(lengths.end(), here.begin(), here.end());
  auto const more = tokens(step * 3 + row, false), more_targets = tokens(step * 3 + row, true);
  ids.insert(ids.end(), more.begin(), more.end()),
      targets.insert(targets.end(), more_targets.begin(), more_targets.end());
}

/// `steps` AdamW steps over packed rows under FSDP (full shard, a unit per block) at dp = the world's size, rank
/// r training on row r of each step; with `rows` and a one-rank world, the unsharded run over every row at once
/// (the mean over all their tokens: each row has 15, so it is the mean of the ranks' means).
template <class World>
Result train_packed_fsdp(World const& world, models::LlamaConfig const& c, int steps, int rows = 1) {
  auto const dp = sw::make_mesh<"dp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<double> model(c);
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(model, dp);
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0});
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::int64_t> ids, targets;
    std::vector<std::size_t> lengths;
    for (int row = 0; row < rows; ++row) packed_row(step, world.rank() + row, ids, targets, lengths);
    auto const logits = sharded.forward(ids, sw::sequence_lengths(lengths));
    auto const loss = models::llama_loss(tp, logits, targets, c.vocabulary);
    sharded.backward(loss.dlogits);
    optimizer.step(sharded);
    sw::zero_grad(sharded);
    r.losses.push_back(sw::all_reduce(dp, loss.loss, sw::Avg{}));
  }
  sharded.unshard();
  sw::for_each_parameter(sharded.model(), [&](std::string const& name, auto const& p) {
    r.parameters.push_back(sw::full_tensor(p)), r.names.push_back(name);
  });
  sharded.reshard();
  return r;
}

/// How a pipeline run keeps each microbatch's activations: kept until its backward, or recomputed there from each
/// block's input (stage_activations::recompute with checkpoint_blocks), under 1F1B or zero-bubble H1 (B and W apart).
struct PipelineRun {
  bool recompute = false;
  bool zero_bubble = false;
};

/// `steps` AdamW steps in pipeline stages (pp = the world's size, one stage each), two microbatches a step,
/// microbatch m the packed row packed_row(step, m), its documents given to every stage (microbatch_rows); the
/// losses and this stage's parameters under their names (a tied output's copy of the embedding left out).
template <class World>
Result train_packed_pipeline(World const& world, models::LlamaConfig const& c, int steps, PipelineRun how) {
  auto const pp = sw::make_mesh<"pp">(world, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  models::LlamaStage<double> stage(c, sw::stage_split(c.layers, world.size()), pp.rank());
  stage.checkpoint_blocks(how.recompute);
  sw::parallelize(stage, tp);
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0});
  Result r;
  for (int step = 0; step < steps; ++step) {
    std::vector<std::vector<std::int64_t>> ids(2), targets(2);
    std::vector<sw::sequence_lengths> rows;
    for (int m = 0; m < 2; ++m) {
      std::vector<std::size_t> lengths;
      packed_row(step, m, ids[std::size_t(m)], targets[std::size_t(m)], lengths);
      rows.emplace_back(lengths);
    }
    stage.microbatch_rows(rows);
    double loss = 0;
    auto const input = [&](int m) { return std::span<const std::int64_t>(ids[std::size_t(m)]); };
    auto const loss_gradient = [&](int m, auto const& h) {
      auto result = stage.head_loss(tp, h, targets[std::size_t(m)], 0.5);  // the mean over the two rows
      loss += result.loss / 2;
      return result.gradient;
    };
    sw::pipeline_options const options{how.recompute ? sw::stage_activations::recompute : sw::stage_activations::keep};
    if (how.zero_bubble)
      sw::run_pipeline_step(sw::ZeroBubbleH1{}, pp, std::span(&stage, 1), 2, input, loss_gradient, options);
    else
      sw::run_pipeline_step(sw::OneFOneB{}, pp, std::span(&stage, 1), 2, input, loss_gradient, options);
    optimizer.step(sw::finish_gradients(stage), dp, pp);
    sw::zero_grad(stage);
    r.losses.push_back(sw::all_reduce(pp, stage.is_last() ? loss : 0.0, sw::Sum{}));
  }
  sw::for_each_parameter(stage, [&](std::string const& name, auto const& p) {
    if (p.mirror_of.empty()) r.parameters.push_back(sw::full_tensor(p)), r.names.push_back(name);
  });
  return r;
}

/// `steps` AdamW steps with each packed row (15 tokens, the step's documents) one whole sequence cut over cp =
/// the world's size (balanced), by `method`: each rank trains on its tokens of the row, its documents attending
/// within themselves across the ranks (the loss weighted by the rank's share of the tokens, the gradients averaged
/// over cp). The config's capacity becomes the row's 15 tokens, the length the cut splits.
template <class World>
Result train_packed_cp(World const& world, models::LlamaConfig c, int steps, sw::context_method method) {
  c.sequence = 15;
  auto const cp = sw::submesh<"cp">(sw::make_mesh<"cp">(world, {world.size()}));
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(world, {world.size(), 1}));
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<double> model(c);
  sw::parallelize(model, tp);
  auto const context = sw::context_parallelize(model, cp, {c.sequence, world.size(), true}, method);
  sw::AdamW<double> optimizer({.learning_rate = 1e-2, .weight_decay = 0.1, .max_grad_norm = 1.0});
  double const weight = context->mean_weight();
  Result r;
  for (int step = 0; step < steps; ++step) {
    auto const logits = model.forward(context->my_tokens(tokens(step, false)), sw::sequence_lengths(documents(step)));
    auto loss = models::llama_loss(tp, logits, context->my_tokens(tokens(step, true)), c.vocabulary);
    loss.dlogits.local *= weight;
    model.backward(loss.dlogits);
    optimizer.step(sw::finish_gradients(model), data);
    sw::zero_grad(model);
    r.losses.push_back(sw::all_reduce(data, loss.loss * weight, sw::Avg{}));
  }
  sw::for_each_parameter(model, [&](std::string const&, auto const& p) { r.parameters.push_back(sw::full_tensor(p)); });
  return r;
}

/// Packed rows cut over cp (ring and all-to-all) against the unsharded run on the same rows: losses and
/// parameters after 5 steps within 1e-10.
template <class World>
void check_cp(World const& world, models::LlamaConfig c) {
  c.sequence = 15;
  Result const serial = train_packed<sw::serial_plan>(sw::serial_world(), c, 5);
  for (auto method : {sw::context_method::ring, sw::context_method::all_to_all}) {
    if (method == sw::context_method::all_to_all && c.kv_heads % std::size_t(world.size()) != 0) continue;
    INFO("cp " << world.size() << (method == sw::context_method::ring ? ", ring" : ", all-to-all"));
    Result const got = train_packed_cp(world, c, 5, method);
    for (std::size_t s = 0; s < got.losses.size(); ++s)
      CHECK(std::abs(got.losses[s] - serial.losses[s]) <= 1e-10 * std::abs(serial.losses[s]));
    check_same(got.parameters, serial.parameters, 1e-10, "parameter after the steps under cp");
  }
}

/// Pipeline stages over packed rows (kept and recomputed activations, 1F1B and zero-bubble H1) against the
/// unsharded run over both rows at once: losses and this stage's parameters after 5 steps within 1e-10.
template <class World>
void check_pipeline(World const& world, models::LlamaConfig const& c, Result const& serial_two_rows) {
  for (PipelineRun how : {PipelineRun{false, false}, PipelineRun{true, false}, PipelineRun{false, true}}) {
    INFO("pp " << world.size() << (how.recompute ? ", recomputed" : ", kept")
               << (how.zero_bubble ? ", zero-bubble H1" : ", 1F1B"));
    Result const got = train_packed_pipeline(world, c, 5, how);
    for (std::size_t s = 0; s < got.losses.size(); ++s)
      CHECK(std::abs(got.losses[s] - serial_two_rows.losses[s]) <= 1e-10 * std::abs(serial_two_rows.losses[s]));
    REQUIRE(!got.names.empty());
    for (std::size_t i = 0; i < got.names.size(); ++i) {
      INFO(got.names[i]);
      auto const at = std::find(serial_two_rows.names.begin(), serial_two_rows.names.end(), got.names[i]);
      REQUIRE(at != serial_two_rows.names.end());
      CHECK(relative_error(got.parameters[i],
                           serial_two_rows.parameters[std::size_t(at - serial_two_rows.names.begin())]) <= 1e-10);
    }
  }
}

/// FSDP at dp 2 over packed rows against the unsharded run over both rows at once: losses and parameters after 5
/// steps within 1e-10.
template <class World>
void check_fsdp(World const& world, models::LlamaConfig const& c, Result const& serial_two_rows) {
  Result const got = train_packed_fsdp(world, c, 5);
  for (std::size_t s = 0; s < got.losses.size(); ++s)
    CHECK(std::abs(got.losses[s] - serial_two_rows.losses[s]) <= 1e-10 * std::abs(serial_two_rows.losses[s]));
  check_same(got.parameters, serial_two_rows.parameters, 1e-10, "parameter after the steps under FSDP");
}

/// The serial packed run against each document alone, and the sharded runs at the world's size against it.
template <class World>
void check_all(World const& world, models::LlamaConfig const& c, Result const& serial) {
  if (world.size() == 1) {
    Result const alone = each_document_alone(c);
    CHECK(relative_error(serial.logits, alone.logits) <= 1e-12);
    check_same(serial.gradients, alone.gradients, 1e-12, "gradient (packed vs each document alone)");
    CHECK(serial.losses.back() < serial.losses.front());
  }
  auto const against_serial = [&](Result const& got, char const* plan) {
    INFO(plan << " at tp " << world.size());
    CHECK(relative_error(got.logits, serial.logits) <= 1e-12);
    check_same(got.gradients, serial.gradients, 1e-12, "gradient");
    for (std::size_t s = 0; s < got.losses.size(); ++s)
      CHECK(std::abs(got.losses[s] - serial.losses[s]) <= 1e-10 * std::abs(serial.losses[s]));
    check_same(got.parameters, serial.parameters, 1e-10, "parameter after the steps");
  };
  against_serial(train_packed<models::llama_plan<false>>(world, c, 5), "TP");
  against_serial(train_packed<models::llama_plan<true>>(world, c, 5), "TP with sequence parallelism");
}

}  // namespace llama_packed_cases
