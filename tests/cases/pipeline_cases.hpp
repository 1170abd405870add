#pragma once
// Pipeline steps against the unsharded run of the same model: a stack of SwiGLU feed-forward blocks
// (examples/blocks.hpp) cut into contiguous stages over a "pp" axis, run by sw::run_pipeline_step with GPipe,
// 1F1B and interleaved 1F1B, microbatches fewer than, equal to and more than the stages. Every block's
// gradient, accumulated over the microbatches, and every microbatch's loss gradient input must equal the
// unsharded run's exactly: the same code on the same numbers, microbatch by microbatch in the same order.
// Used by test_pipeline_run (threads) and test_mpi_pipeline (MPI).
#include <doctest/doctest.h>

#include <shardwise/nn.hpp>
#include <shardwise/shardwise.hpp>
#include <span>
#include <vector>

#include "../examples/blocks.hpp"

namespace pipeline_cases {

namespace sw = shardwise;
using Matrix = sw::nn::matrix<double>;
using X = sw::Activation<double>;
constexpr std::size_t dim = 6, hidden = 10;

/// Blocks [first, first + count) of the model: block i has parameters drawn from seed 100 + 10 i wherever it lives.
struct Stack {
  std::vector<blocks::FeedForward<double>> layers;
  SHARDWISE_CHILDREN(layers)
  SHARDWISE_SAVED()
  Stack(int first, int count) {
    for (int i = first; i < first + count; ++i)
      layers.emplace_back(dim, hidden, 100 + 10 * static_cast<std::uint64_t>(i));
  }
  X forward(X x) {
    for (auto& layer : layers) x = sw::forward(layer, x);
    return x;
  }
  X backward(X dy) {
    for (auto layer = layers.rbegin(); layer != layers.rend(); ++layer) dy = sw::backward(*layer, dy);
    return dy;
  }
};

inline X microbatch_input(int m, Eigen::Index tokens) {
  Matrix x(tokens, static_cast<Eigen::Index>(dim));
  for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = std::sin(0.3 * static_cast<double>(i + 17 * m));
  return {x};
}

/// The gradient of a loss sum(y * target(m)) / tokens: target(m) / tokens, depending on y through a square so
/// that a wrong output shows in the gradient.
inline X loss_gradient(int m, X const& y) {
  Matrix g(y.local.rows(), y.local.cols());
  for (Eigen::Index i = 0; i < g.size(); ++i) g.data()[i] = std::cos(0.7 * static_cast<double>(i + 5 * m));
  return {Matrix(g.cwiseProduct(y.local) / static_cast<double>(y.local.rows()))};
}

/// Every block's gradients (w1, w3, w2 of each layer, in model order) of `stack`.
inline std::vector<Matrix> gradients_of(Stack& stack) {
  std::vector<Matrix> all;
  for (auto& layer : stack.layers) {
    all.push_back(layer.w1.weight_grad);
    all.push_back(layer.w3.weight_grad);
    all.push_back(layer.w2.weight_grad);
  }
  return all;
}

/// The unsharded run: all `layers` blocks on one rank, microbatches back to back.
inline std::vector<Matrix> unsharded(int layers, int microbatches, Eigen::Index tokens) {
  Stack model(0, layers);
  for (int m = 0; m < microbatches; ++m) model.backward(loss_gradient(m, model.forward(microbatch_input(m, tokens))));
  return gradients_of(model);
}

/// This rank's chunks for `chunks_per_rank` chunks each of `per_stage` blocks: chunk c is stage c * ranks + rank,
/// or as `placement` puts it.
inline std::vector<Stack> chunks_of(int rank, int ranks, int chunks_per_rank, int per_stage,
                                    sw::stage_placement placement = sw::stage_placement::loop) {
  sw::pipeline_shape const shape{ranks, chunks_per_rank, 1, placement};
  std::vector<Stack> chunks;
  for (int c = 0; c < chunks_per_rank; ++c) chunks.emplace_back(shape.stage_of(rank, c) * per_stage, per_stage);
  return chunks;
}

/// Runs one step on the 1-D mesh `pp`; returns, gathered on every rank through the chunks' stage order, the
/// gradients of the whole model (each rank contributes its chunks; compared on the rank that holds them).
template <class Schedule, class Mesh>
void check_against_unsharded(Mesh const& pp, Schedule const& schedule, int per_stage, int microbatches,
                             Eigen::Index tokens = 4, sw::pipeline_options options = {}) {
  int const ranks = pp.size(), rank = pp.rank(), v = Schedule::chunks_per_rank;
  int const layers = ranks * v * per_stage;
  auto const expected = unsharded(layers, microbatches, tokens);
  auto const shape = sw::shape_of<Schedule>(ranks, microbatches);
  auto chunks = chunks_of(rank, ranks, v, per_stage, shape.placement);
  sw::run_pipeline_step(
      schedule, pp, std::span<Stack>(chunks), microbatches, [&](int m) { return microbatch_input(m, tokens); },
      loss_gradient, options);
  for (int c = 0; c < v; ++c) {
    int const stage = shape.stage_of(rank, c);
    auto const mine = gradients_of(chunks[static_cast<std::size_t>(c)]);
    for (std::size_t i = 0; i < mine.size(); ++i) {
      auto const& want = expected[static_cast<std::size_t>(stage * per_stage * 3) + i];
      INFO("rank " << rank << ", chunk " << c << ", gradient " << i << ", microbatches " << microbatches);
      REQUIRE(mine[i].size() == want.size());
      CHECK(mine[i] == want);
    }
  }
}

/// GPipe, 1F1B and ZB-H1 with 1 .. 2 * stages + 1 microbatches, ZBV (V placement) with 1, 2p - 1 and 2p + 2 (fewer than
/// the stages too), DualPipeV (V placement) with 2p and 2p + 3, interleaved 1F1B (two chunks per rank) with multiples
/// of the stages.
template <class Mesh>
void check_all(Mesh const& pp) {
  int const ranks = pp.size();
  for (int microbatches = 1; microbatches <= 2 * ranks + 1; ++microbatches) {
    check_against_unsharded(pp, sw::GPipe{}, 2, microbatches);
    check_against_unsharded(pp, sw::OneFOneB{}, 1, microbatches);
    check_against_unsharded(pp, sw::ZeroBubbleH1{}, 1, microbatches);
  }
  for (int microbatches = ranks; microbatches <= 2 * ranks; microbatches += ranks)
    check_against_unsharded(pp, sw::Interleaved1F1B<2>{}, 1, microbatches);
  for (int microbatches : {1, 2 * ranks - 1, 2 * ranks + 2})  // fewer than 2 p - 1 (padding dropped), and more
    check_against_unsharded(pp, sw::ZeroBubbleV{}, 1, microbatches);
  for (int microbatches : {2 * ranks, 2 * ranks + 3})  // DualPipeV: at least 2 p
    check_against_unsharded(pp, sw::DualPipeV{}, 1, microbatches);
  // 32768 tokens x 6 doubles: 1.5 MiB per message, past every eager limit, so that a blocking MPI send would
  // wait for its receive and 1F1B's neighbours, sending to each other, would hang without buffered sends.
  check_against_unsharded(pp, sw::OneFOneB{}, 1, 2 * ranks, 1 << 15);
  // Activation checkpointing per stage: the forward recomputed in the backward gives the same numbers.
  sw::pipeline_options const recompute{sw::stage_activations::recompute};
  check_against_unsharded(pp, sw::OneFOneB{}, 2, ranks + 1, 4, recompute);
  check_against_unsharded(pp, sw::Interleaved1F1B<2>{}, 1, ranks, 4, recompute);
}

/// A schedule that would hang is refused before any data moves, with the same words on every rank.
template <class Mesh>
void check_refusal(Mesh const& pp) {
  auto chunks = chunks_of(pp.rank(), pp.size(), 2, 1);
  if (pp.size() < 2) return;  // one rank runs every count
  auto input = [](int m) { return microbatch_input(m, 4); };
  CHECK_THROWS_WITH_AS(sw::run_pipeline_step(sw::Interleaved1F1B<2>{}, pp, std::span<Stack>(chunks), pp.size() + 1,
                                             input, loss_gradient),
                       doctest::Contains("shardwise::check_schedule"), sw::error);
}

/// Ranks that would run different steps — other microbatch counts, another schedule — are refused before any
/// data moves, naming every rank's step, with the same words on every rank (at once: no timeout is involved).
template <class Mesh>
void check_disagreement(Mesh const& pp) {
  if (pp.size() < 2) return;
  int const n = pp.size();
  auto chunks = chunks_of(pp.rank(), n, 1, 1);
  auto input = [](int m) { return microbatch_input(m, 4); };
  auto const refused = [&](char const* what, auto&& step, std::vector<std::string> const& parts) {
    CAPTURE(what);
    std::string message = "(no error)";
    try {
      step();
    } catch (sw::error const& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.find("shardwise::run_pipeline_step: the ranks of pipeline axis \"pp\" run different steps") == 0);
    for (auto const& part : parts) CHECK_MESSAGE(message.find(part) != std::string::npos, part);
    auto const text_hash = static_cast<double>(std::hash<std::string>{}(message) >> 12);  // exact in a double
    CHECK(sw::all_reduce(pp, text_hash, sw::Max{}) == sw::all_reduce(pp, text_hash, sw::Min{}));
  };
  std::string const last = std::to_string(n - 1);
  refused("microbatches",
          [&] {
            sw::run_pipeline_step(sw::OneFOneB{}, pp, std::span<Stack>(chunks), pp.rank() == 0 ? n + 1 : n, input,
                                  loss_gradient);
          },
          {"rank 0 runs shardwise::OneFOneB with " + std::to_string(n + 1) + " microbatches and 1 chunk per rank",
           "rank " + last + " runs shardwise::OneFOneB with " + std::to_string(n) + " microbatches"});
  refused("schedule",
          [&] {
            if (pp.rank() == 0)
              sw::run_pipeline_step(sw::GPipe{}, pp, std::span<Stack>(chunks), n, input, loss_gradient);
            else
              sw::run_pipeline_step(sw::OneFOneB{}, pp, std::span<Stack>(chunks), n, input, loss_gradient);
          },
          {"rank 0 runs shardwise::GPipe with ", "rank " + last + " runs shardwise::OneFOneB with "});
  // The axis is in step afterwards: a step all agree on runs.
  check_against_unsharded(pp, sw::OneFOneB{}, 1, n);
}

}  // namespace pipeline_cases
