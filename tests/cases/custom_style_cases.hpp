#pragma once
// A parallel style written outside the library (examples/bf16_style.hpp), used on sw::Linear with no edit under
// include/: column-wise like ColwiseParallel on a sequence-parallel input, but its input all-gather runs in
// bfloat16 (half the bytes of fp32, a quarter of fp64), and its output stays sharded. Checked on the SwiGLU block of
// examples/blocks.hpp (w1, w3 in this style, w2 RowwiseParallel to the sequence) against the unsharded block:
// - forward, backward and five AdamW steps equal the unsharded run (fp64, 1e-12 relative): the block's input is
//   data already in bfloat16's precision, so the low-precision gather moves it exactly;
// - what the counting mesh records equals the layers' costs, and the gathers move 2 bytes a value;
// - a sharded checkpoint round trip restores every parameter bit for bit;
// - LoRA adapters on the block's Linears, this style's included, train like the unsharded block's.
// And a module style written here (sw::module_style): the same block's input gathered in bfloat16 at its
// boundary by sw::forward, checked against the unsharded block and the counting mesh against sw::call_cost.
#include <doctest/doctest.h>

#include <Eigen/Core>
#include <cstdint>
#include <filesystem>
#include <random>
#include <shardwise/checkpoint/sharded.hpp>
#include <shardwise/mesh/counting.hpp>
#include <shardwise/mesh/serial.hpp>
#include <string>
#include <type_traits>
#include <vector>

#include "../../examples/bf16_style.hpp"
#include "../../examples/blocks.hpp"
#include "support/transfers.hpp"

namespace custom_style_cases {

namespace sw = shardwise;
using matrix = sw::nn::matrix<double>;

using bf16_style::Bf16GatherColwise;

using Plan = sw::plan<sw::at<"w1", Bf16GatherColwise>, sw::at<"w3", Bf16GatherColwise>,
                      sw::at<"w2", sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>>;
using Block = blocks::FeedForward<double, Plan>;
using SerialBlock = blocks::FeedForward<double, sw::serial_plan>;

constexpr std::size_t dim = 16, hidden = 32, tokens = 12;

/// Random values already in bfloat16's precision (what the block reads is then gathered exactly).
inline matrix bf16_data(std::size_t rows, std::size_t cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  matrix m(static_cast<Eigen::Index>(rows), static_cast<Eigen::Index>(cols));
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<float>(Eigen::bfloat16(u(rng)));
  return m;
}

inline double relative_error(matrix const& got, matrix const& expected) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) return 1e300;
  return (got - expected).cwiseAbs().maxCoeff() / std::max(1e-30, expected.cwiseAbs().maxCoeff());
}

/// This rank's rows of a sequence-cut activation (tokens divide over the ranks here).
inline matrix rows_of(matrix const& full, int rank, int n) {
  auto const rows = full.rows() / n;
  return full.middleRows(rank * rows, rows);
}

/// Each sharded parameter against the unsharded block's, cut by hand: w1, w3 by output rows, w2 by input columns.
inline void check_parameters(Block& sharded, SerialBlock& serial, int rank, int n, char const* when) {
  auto rows = [&](matrix const& m) { return matrix(m.middleRows(rank * m.rows() / n, m.rows() / n)); };
  auto cols = [&](matrix const& m) { return matrix(m.middleCols(rank * m.cols() / n, m.cols() / n)); };
  INFO(when);
  CHECK(relative_error(sharded.w1.weight, rows(serial.w1.weight)) <= 1e-12);
  CHECK(relative_error(sharded.w3.weight, rows(serial.w3.weight)) <= 1e-12);
  CHECK(relative_error(sharded.w2.weight, cols(serial.w2.weight)) <= 1e-12);
}

/// The block parallelized over `tp` and the unsharded one, from the same seed, each with its AdamW (lr 1e-2).
struct block_pair {
  Block sharded{dim, hidden, 5};
  SerialBlock serial{dim, hidden, 5};

  template <class Tp>
  explicit block_pair(Tp const& tp) : sharded_adam_(options()), serial_adam_(options()) {
    sw::parallelize(sharded, tp);
  }
  /// One AdamW step of each over its finished gradients (the sharded one's over `dp`), then the gradients zeroed.
  template <class Dp>
  void step(Dp const& dp) {
    sharded_adam_.step(sw::finish_gradients(sharded), dp);
    serial_adam_.step(sw::finish_gradients(serial), sw::make_mesh<"dp">(sw::serial_world(), {1}));
    sw::zero_grad(sharded);
    sw::zero_grad(serial);
  }

 private:
  static sw::AdamWOptions<double> options() { return {.learning_rate = 1e-2}; }
  sw::AdamW<double> sharded_adam_, serial_adam_;
};

/// Forward, backward and five AdamW steps against the unsharded block; the counting mesh's record of the first
/// forward and backward against the layers' costs.
template <class World>
void trains_like_the_unsharded_block(World const& world) {
  int const n = world.size(), rank = world.rank();
  auto counted = sw::counting(world);
  auto const mesh = sw::make_mesh<"dp", "tp">(counted, {1, n});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  block_pair blocks(tp);
  Block& sharded = blocks.sharded;
  SerialBlock& serial = blocks.serial;
  sw::cost_inputs const s{tokens, static_cast<std::size_t>(n), static_cast<std::size_t>(rank), "tp"};
  for (int step = 0; step < 5; ++step) {
    matrix const x = bf16_data(tokens, dim, 100 + step), dy = bf16_data(tokens, dim, 200 + step);
    counted.log().clear();
    auto const y = sharded.forward(sw::Activation<double, sw::Shard<0>>{rows_of(x, rank, n)});
    auto const forward_record = counted.log().entries();
    auto const y0 = serial.forward(sw::Activation<double>{x});
    CHECK(relative_error(y.local, rows_of(y0.local, rank, n)) <= 1e-12);
    counted.log().clear();
    auto const dx = sharded.backward(sw::Activation<double, sw::Shard<0>>{rows_of(dy, rank, n)});
    auto const backward_record = counted.log().entries();
    auto const dx0 = serial.backward(sw::Activation<double>{dy});
    CHECK(relative_error(dx.local, rows_of(dx0.local, rank, n)) <= 1e-12);
    if (step == 0) {
      sw::cost const c1 = decltype(sharded.w1)::shardwise_cost(dim, hidden, s);
      sw::cost const c2 = decltype(sharded.w2)::shardwise_cost(hidden, dim, s);
      sw::transfer_list<> forward, backward;  // forward: w1, w3, w2; backward: w2, w1, w3 (blocks::FeedForward)
      forward.append(c1.forward).append(c1.forward).append(c2.forward);
      backward.append(c2.backward).append(c1.backward).append(c1.backward);
      CHECK(forward_record == forward);
      CHECK(backward_record == backward);
      // By hand: each of w1 and w3 gathers this rank's tokens / n rows of dim values, 2 bytes each.
      REQUIRE(!forward_record.empty());
      CHECK(forward_record.front().kind == sw::transfer_kind::all_gather);
      CHECK(forward_record.front().bytes == tokens / static_cast<std::size_t>(n) * dim * 2);
    }
    blocks.step(dp);
  }
  check_parameters(sharded, serial, rank, n, "after five AdamW steps");
}

/// LoRA adapters (sw::add_lora) on the block's three Linears, the style's included, with nothing added to the style:
/// five AdamW steps of the adapters (the base frozen) give the unsharded block's outputs, input gradients and
/// adapters (fp64, 1e-12 relative).
template <class World>
void adapters_train_like_the_unsharded_block(World const& world) {
  int const n = world.size(), rank = world.rank();
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, n});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  block_pair blocks(tp);
  Block& sharded = blocks.sharded;
  SerialBlock& serial = blocks.serial;
  sw::LoraConfig const lora{.rank = 4, .alpha = 8, .target_modules = {"w[123]"}};
  CHECK(sw::add_lora(sharded, lora) == 3);
  CHECK(sw::add_lora(serial, lora) == 3);
  for (int step = 0; step < 5; ++step) {
    matrix const x = bf16_data(tokens, dim, 300 + step), dy = bf16_data(tokens, dim, 400 + step);
    auto const y = sharded.forward(sw::Activation<double, sw::Shard<0>>{rows_of(x, rank, n)});
    CHECK(relative_error(y.local, rows_of(serial.forward(sw::Activation<double>{x}).local, rank, n)) <= 1e-12);
    auto const dx = sharded.backward(sw::Activation<double, sw::Shard<0>>{rows_of(dy, rank, n)});
    CHECK(relative_error(dx.local, rows_of(serial.backward(sw::Activation<double>{dy}).local, rank, n)) <= 1e-12);
    blocks.step(dp);
  }
  std::vector<matrix> expected;
  sw::for_each_parameter(serial, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") != std::string::npos) expected.push_back(*p.value);
  });
  std::size_t i = 0;
  sw::for_each_parameter(sharded, [&](std::string const& name, auto const& p) {
    if (name.find(".lora_") == std::string::npos) return;
    INFO(name);
    REQUIRE(i < expected.size());
    CHECK(relative_error(sw::full_tensor(p), expected[i++]) <= 1e-12);
  });
  CHECK(i == 6);
}

/// A module style written here, not in the library (sw::module_style): the module's sequence-cut input is
/// gathered at its boundary in bfloat16, by the same mover; the gradient goes back the library's way.
struct Bf16PrepareInput {
  using input_layouts = sw::Shard<0>;
  using desired_input_layouts = sw::Replicate;
  using mover = bf16_style::bf16_gather_mover;
};
static_assert(sw::module_style<Bf16PrepareInput> &&
              sw::module_style<sw::PrepareModuleOutput<sw::Shard<0>, sw::Replicate>>);
static_assert(!sw::module_style<sw::ColwiseParallel<>> && !sw::module_style<sw::SequenceParallel<>>);

template <class T, class Plan>
struct WithFeedForward {
  blocks::FeedForward<T, sw::subplan<Plan, "feed_forward">> feed_forward;
  SHARDWISE_CHILDREN(feed_forward)
  WithFeedForward(std::size_t d, std::size_t h, std::uint64_t seed) : feed_forward(d, h, seed) {}
};
using ModulePlan = sw::plan<sw::at<"feed_forward", Bf16PrepareInput>, sw::at<"feed_forward.w1", sw::ColwiseParallel<>>,
                            sw::at<"feed_forward.w3", sw::ColwiseParallel<>>,
                            sw::at<"feed_forward.w2", sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>>;

/// sw::forward / sw::backward apply the module style at the boundary: the results equal the unsharded block's
/// (fp64, 1e-12: the input is in bfloat16's precision), and the counting mesh's record equals the module's
/// call cost (sw::call_cost, which asks the style's mover), its first gather moving 2 bytes a value.
template <class World>
void module_style_at_a_boundary(World const& world) {
  int const n = world.size(), rank = world.rank();
  auto counted = sw::counting(world);
  auto const tp = sw::make_mesh<"tp">(counted, {n});
  WithFeedForward<double, ModulePlan> model(dim, hidden, 5);
  SerialBlock serial(dim, hidden, 5);
  sw::parallelize(model, tp);
  matrix const x = bf16_data(tokens, dim, 300), dy = bf16_data(tokens, dim, 301);
  counted.log().clear();
  auto const y = sw::forward(model.feed_forward, sw::Activation<double, sw::Shard<0>>{rows_of(x, rank, n)});
  auto const forward_record = counted.log().entries();
  counted.log().clear();
  auto const dx = sw::backward(model.feed_forward, sw::Activation<double, sw::Shard<0>>{rows_of(dy, rank, n)});
  auto const backward_record = counted.log().entries();
  CHECK(relative_error(y.local, rows_of(serial.forward(sw::Activation<double>{x}).local, rank, n)) <= 1e-12);
  CHECK(relative_error(dx.local, rows_of(serial.backward(sw::Activation<double>{dy}).local, rank, n)) <= 1e-12);

  using Module = decltype(model.feed_forward);
  sw::cost_inputs const s{tokens, static_cast<std::size_t>(n), static_cast<std::size_t>(rank), "tp"};
  sw::cost const c1 = decltype(model.feed_forward.w1)::shardwise_cost(dim, hidden, s);
  sw::cost const c2 = decltype(model.feed_forward.w2)::shardwise_cost(hidden, dim, s);
  sw::cost inner;
  inner.forward.append(c1.forward).append(c1.forward).append(c2.forward);
  inner.backward.append(c2.backward).append(c1.backward).append(c1.backward);
  sw::cost const predicted = sw::call_cost<Module, double>(inner, dim, dim, s);
  INFO("forward recorded:\n" << listed(forward_record) << "predicted:\n" << predicted.forward);
  CHECK(forward_record == predicted.forward);
  INFO("backward recorded:\n" << listed(backward_record) << "predicted:\n" << predicted.backward);
  CHECK(backward_record == predicted.backward);
  if (n > 1) {  // by hand: the boundary gathers this rank's tokens / n rows of dim values, 2 bytes each
    REQUIRE(!forward_record.empty());
    CHECK(forward_record.front().kind == sw::transfer_kind::all_gather);
    CHECK(forward_record.front().bytes == tokens / static_cast<std::size_t>(n) * dim * 2);
  }
}

/// Saved sharded, loaded into a block of other weights: every parameter bit for bit.
template <class World>
void checkpoint_round_trip(World const& world, std::filesystem::path const& dir) {
  int const n = world.size(), rank = world.rank();
  auto const tp = sw::make_mesh<"tp">(world, {n});
  Block saved(dim, hidden, 5), loaded(dim, hidden, 99);
  sw::parallelize(saved, tp);
  sw::parallelize(loaded, tp);
  sw::save_sharded(saved, tp, dir, 3);
  auto const index = sw::load_sharded(loaded, tp, dir);
  CHECK(index.step == 3);
  CHECK(loaded.w1.weight == saved.w1.weight);
  CHECK(loaded.w3.weight == saved.w3.weight);
  CHECK(loaded.w2.weight == saved.w2.weight);
  SerialBlock serial(dim, hidden, 5);
  check_parameters(loaded, serial, rank, n, "loaded");
}

}  // namespace custom_style_cases
