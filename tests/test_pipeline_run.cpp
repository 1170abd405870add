// Pipeline steps on the thread mesh at 1, 2 and 4 pipeline ranks against the unsharded run (cases/pipeline_cases.hpp),
// and the property test: every schedule at stages <= 8, chunks <= 3, microbatches <= 16 runs to completion with
// random delays before each forward and backward, with the unsharded run's gradients.
#include <doctest/doctest.h>

#include <chrono>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cases/pipeline_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("run_pipeline_step: GPipe, 1F1B, ZB-H1, ZBV and interleaved 1F1B equal the unsharded run, thread mesh") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " pipeline ranks");
    worlds::run_threads(ranks, [&](auto& world) {
      auto const pp = shardwise::make_mesh<"pp">(world, {ranks});
      pipeline_cases::check_all(pp);
      pipeline_cases::check_refusal(pp);
    });
  }
}

TEST_CASE("pipeline ranks that would run different steps are refused on every rank, thread mesh (2, 3, 4)") {
  for (int ranks : {2, 3, 4}) {
    INFO(ranks << " pipeline ranks");
    worlds::run_threads(
        ranks, [&](auto& world) { pipeline_cases::check_disagreement(shardwise::make_mesh<"pp">(world, {ranks})); });
  }
}

TEST_CASE("a schedule proven at compile time runs without a run-time check, and only on its stage count") {
  using proven = shardwise::checked_schedule<shardwise::OneFOneB, 2, 3>;
  worlds::run_threads(2, [&](auto& world) {
    auto const pp = shardwise::make_mesh<"pp">(world, {2});
    auto const expected = pipeline_cases::unsharded(2, 3, 4);
    auto chunks = pipeline_cases::chunks_of(pp.rank(), 2, 1, 1);
    shardwise::run_pipeline_step(
        proven{}, pp, std::span<pipeline_cases::Stack>(chunks),
        [](int m) { return pipeline_cases::microbatch_input(m, 4); }, pipeline_cases::loss_gradient);
    auto const mine = pipeline_cases::gradients_of(chunks[0]);
    for (std::size_t i = 0; i < mine.size(); ++i)
      CHECK(mine[i] == expected[static_cast<std::size_t>(pp.rank() * 3) + i]);
  });
  worlds::run_threads(4, [&](auto& world) {
    auto const pp = shardwise::make_mesh<"pp">(world, {4});
    auto chunks = pipeline_cases::chunks_of(pp.rank(), 4, 1, 1);
    CHECK_THROWS_WITH_AS(
        shardwise::run_pipeline_step(
            proven{}, pp, std::span<pipeline_cases::Stack>(chunks),
            [](int m) { return pipeline_cases::microbatch_input(m, 4); }, pipeline_cases::loss_gradient),
        "shardwise::run_pipeline_step: the schedule was proven for 2 stages but the pipeline axis "
        "has 4 ranks; prove it for 4 (sw::checked_schedule<Schedule, 4, 3>)",
        shardwise::error);
  });
}

namespace {

/// A chunk that waits a random 0-40 µs before each forward and backward, so that the ranks reach their sends
/// and receives in ever other interleavings.
struct Delayed {
  pipeline_cases::Stack stack;
  SHARDWISE_CHILDREN(stack)
  SHARDWISE_SAVED()
  Delayed(int first, int count) : stack(first, count) {}
  static void wait() {
    thread_local std::mt19937 rng(std::random_device{}());
    std::this_thread::sleep_for(std::chrono::microseconds(rng() % 41));
  }
  pipeline_cases::X forward(pipeline_cases::X const& x) {
    wait();
    return stack.forward(x);
  }
  pipeline_cases::X backward(pipeline_cases::X const& dy) {
    wait();
    return stack.backward(dy);
  }
};

/// One step of `schedule` with random delays on `stages` threads; every gradient must equal the unsharded run's.
template <class Schedule>
void run_with_delays(Schedule const& schedule, int stages, int microbatches) {
  int const v = Schedule::chunks_per_rank;
  auto const shape = shardwise::shape_of<Schedule>(stages, microbatches);
  auto const expected = pipeline_cases::unsharded(stages * v, microbatches, 2);
  worlds::run_threads(stages, [&](auto& world) {
    auto const pp = shardwise::make_mesh<"pp">(world, {stages});
    std::vector<Delayed> chunks;
    for (int c = 0; c < v; ++c) chunks.emplace_back(shape.stage_of(pp.rank(), c), 1);
    shardwise::run_pipeline_step(
        schedule, pp, std::span<Delayed>(chunks), microbatches,
        [](int m) { return pipeline_cases::microbatch_input(m, 2); }, pipeline_cases::loss_gradient);
    for (int c = 0; c < v; ++c) {
      auto const mine = pipeline_cases::gradients_of(chunks[static_cast<std::size_t>(c)].stack);
      for (std::size_t i = 0; i < mine.size(); ++i)
        CHECK(mine[i] == expected[static_cast<std::size_t>(shape.stage_of(pp.rank(), c) * 3) + i]);
    }
  });
}

}  // namespace

TEST_CASE(
    "property: every schedule runs to completion with random per-action delays, stages <= 8, chunks <= 3, "
    "microbatches <= 16") {
  for (int stages = 1; stages <= 8; ++stages)
    for (int microbatches = 1; microbatches <= 16; ++microbatches) {
      CAPTURE(stages);
      CAPTURE(microbatches);
      run_with_delays(shardwise::GPipe{}, stages, microbatches);
      run_with_delays(shardwise::OneFOneB{}, stages, microbatches);
      run_with_delays(shardwise::ZeroBubbleH1{}, stages, microbatches);
      run_with_delays(shardwise::ZeroBubbleV{}, stages, microbatches);
      if (microbatches % stages != 0) continue;  // interleaved runs whole groups (refused otherwise: above)
      run_with_delays(shardwise::Interleaved1F1B<2>{}, stages, microbatches);
      run_with_delays(shardwise::Interleaved1F1B<3>{}, stages, microbatches);
    }
}

namespace {

/// A chunk that logs how each of its backwards ran: as B (weight-gradient work put off: "B", with whether its
/// Linears' weight gradients were still zero after it) or whole ("whole"); as B it puts off work of its own, which
/// logs "W" when W runs it.
struct Logging {
  pipeline_cases::Stack stack;
  std::vector<std::string>* log = nullptr;
  SHARDWISE_CHILDREN(stack)
  SHARDWISE_SAVED()
  Logging(int first, int count, std::vector<std::string>& to) : stack(first, count), log(&to) {}
  pipeline_cases::X forward(pipeline_cases::X const& x) { return stack.forward(x); }
  pipeline_cases::X backward(pipeline_cases::X const& dy) {
    auto* later = shardwise::weight_gradients_deferred_to(*this);
    auto dx = stack.backward(dy);
    if (!later) {
      log->push_back("whole");
      return dx;
    }
    log->push_back(stack.layers[0].w1.weight_grad.squaredNorm() == 0 ? "B (w1 gradient zero)" : "B");
    later->defer([this] { log->push_back("W"); });
    return dx;
  }
};

}  // namespace

TEST_CASE("ZB-H1's B puts the Linears' weight gradients off to its W, and a module of your own can do the same") {
  for (bool split : {true, false}) {
    std::vector<std::string> log;
    auto const expected = pipeline_cases::unsharded(1, 2, 4);
    shardwise::run_threads(1, [&](auto& world) {
      auto const pp = shardwise::make_mesh<"pp">(world, {1});
      std::vector<Logging> chunks;
      chunks.emplace_back(0, 1, log);
      auto const input = [](int m) { return pipeline_cases::microbatch_input(m, 4); };
      if (split)  // one stage: F0 B0 W0 F1 B1 W1
        shardwise::run_pipeline_step(shardwise::ZeroBubbleH1{}, pp, std::span<Logging>(chunks), 2, input,
                                     pipeline_cases::loss_gradient);
      else
        shardwise::run_pipeline_step(shardwise::OneFOneB{}, pp, std::span<Logging>(chunks), 2, input,
                                     pipeline_cases::loss_gradient);
      auto const mine = pipeline_cases::gradients_of(chunks[0].stack);
      for (std::size_t i = 0; i < mine.size(); ++i) CHECK(mine[i] == expected[i]);
      CHECK(shardwise::weight_gradients_deferred_to(chunks[0]) == nullptr);  // disarmed once the step is over
    });
    if (split)
      CHECK(log == std::vector<std::string>{"B (w1 gradient zero)", "W", "B", "W"});
    else
      CHECK(log == std::vector<std::string>{"whole", "whole"});
  }
}

namespace {

/// An embedding, both norms and a Linear with a bias, each backward run whole or as B then W; two microbatches
/// accumulate, as in a pipeline step.
struct EveryLayer {
  shardwise::Embedding<double> table{10, 6, 3};
  shardwise::RMSNorm<double> rms{6};
  shardwise::LayerNorm<double> layer{6};
  shardwise::Linear<double> linear{6, 5, 7, true};
  SHARDWISE_CHILDREN(table, rms, layer, linear)
  SHARDWISE_SAVED()

  void step(int microbatch, bool split) {
    std::vector<std::int64_t> const ids{1, 4, 4, 9 - microbatch};
    auto const y = linear(layer(rms(table(ids))));
    pipeline_cases::Matrix dy(y.local.rows(), y.local.cols());
    for (Eigen::Index i = 0; i < dy.size(); ++i) dy.data()[i] = std::cos(0.37 * double(i + 11 * microbatch));
    shardwise::deferred_weight_gradients later;
    {
      std::optional<shardwise::defer_weight_gradients<EveryLayer>> into;
      if (split) into.emplace(*this, later);
      table.backward(rms.backward(layer.backward(linear.backward(shardwise::Activation<double>{dy}))));
    }
    if (split) CHECK(later.size() == 4);  // one record per layer, W's work
    later.run();
  }
};

}  // namespace

TEST_CASE("B then W gives each layer's weight gradients of the whole backward, bit for bit") {
  EveryLayer whole, split;
  for (int m = 0; m < 2; ++m) whole.step(m, false), split.step(m, true);
  CHECK(split.table.weight_grad == whole.table.weight_grad);
  CHECK(split.rms.weight_grad == whole.rms.weight_grad);
  CHECK(split.layer.weight_grad == whole.layer.weight_grad);
  CHECK(split.layer.bias_grad == whole.layer.bias_grad);
  CHECK(split.linear.weight_grad == whole.linear.weight_grad);
  CHECK(split.linear.bias_grad == whole.linear.bias_grad);
  CHECK(whole.linear.weight_grad.norm() > 0);
}
