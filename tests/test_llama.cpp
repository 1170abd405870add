// The Llama model trained sharded on the thread mesh: 50 steps, loss curve and final parameters equal to the
// unsharded run (fp32, 1e-4 relative) for TP 2, TP 4, TP 2 with sequence parallelism, dp 2 x tp 2 and
// dp 2 x tp 2 with ZeRO-1.
#include <doctest/doctest.h>

#include "cases/llama_cases.hpp"

namespace {
int const steps = llama_cases::steps();
}

TEST_CASE("Llama: sharded training equals the unsharded run, thread mesh") {
  auto const c = llama_cases::small_config();
  llama_cases::Run serial;
  shardwise::run_threads(
      1, [&](auto& world) { serial = llama_cases::train<shardwise::serial_plan>(world, 1, steps, false, c); });
  CHECK(serial.losses.back() < serial.losses.front());  // it learns
  auto check = [&](char const* name, int ranks, int dp, bool zero1, auto plan_tag) {
    using Plan = typename decltype(plan_tag)::type;
    INFO(std::string(name));
    shardwise::run_threads(ranks, [&](auto& world) {
      auto const run = llama_cases::train<Plan>(world, dp, steps, zero1, c);
      if (world.rank() == 0) llama_cases::check_same_run(run, serial);
    });
  };
  using tp_only = std::type_identity<shardwise::models::llama_plan<false>>;
  using sequence_parallel = std::type_identity<shardwise::models::llama_plan<true>>;
  check("TP 2", 2, 1, false, tp_only{});
  check("TP 4", 4, 1, false, tp_only{});
  check("TP 2 with sequence parallelism", 2, 1, false, sequence_parallel{});
  check("dp 2 x tp 2", 4, 2, false, sequence_parallel{});
  check("dp 2 x tp 2 with ZeRO-1", 4, 2, true, sequence_parallel{});
}

TEST_CASE("Llama: grouped-query attention, a padded vocabulary, gradient accumulation") {
  auto check_against_serial = [](char const* name, llama_cases::Run const& serial, int ranks, int dp, auto plan_tag,
                                 shardwise::models::LlamaConfig const& c, int micro_batches) {
    using Plan = typename decltype(plan_tag)::type;
    INFO(std::string(name));
    shardwise::run_threads(ranks, [&](auto& world) {
      auto const run = llama_cases::train<Plan>(world, dp, steps, false, c, micro_batches);
      if (world.rank() == 0) llama_cases::check_same_run(run, serial);
    });
  };
  using sequence_parallel = std::type_identity<shardwise::models::llama_plan<true>>;
  auto serial_run = [](shardwise::models::LlamaConfig const& c) {
    llama_cases::Run run;
    shardwise::run_threads(
        1, [&](auto& world) { run = llama_cases::train<shardwise::serial_plan>(world, 1, steps, false, c); });
    return run;
  };
  {
    auto c = llama_cases::small_config();
    c.kv_heads = 2;  // two query heads per key-value head
    check_against_serial("GQA at TP 2", serial_run(c), 2, 1, sequence_parallel{}, c, 1);
  }
  {
    // Fewer key-value heads than tp ranks: each is repeated (kv_size_multiplier 2, then 4), the copies'
    // gradients summed, counted once in the clipped norm.
    auto c = llama_cases::small_config();
    c.kv_heads = 1;
    auto const serial = serial_run(c);
    check_against_serial("1 key-value head at TP 2", serial, 2, 1, sequence_parallel{}, c, 1);
    check_against_serial("1 key-value head at TP 4", serial, 4, 1, sequence_parallel{}, c, 1);
    c.kv_heads = 2;
    check_against_serial("2 key-value heads at TP 4", serial_run(c), 4, 1, sequence_parallel{}, c, 1);
    c.heads = 8, c.kv_size_multiplier = 4;  // more copies than needed: 8 repeated heads, 2 per rank
    check_against_serial("8 heads, 2 key-value heads at TP 4, multiplier 4", serial_run(c), 4, 1, sequence_parallel{},
                         c, 1);
  }
  {
    auto c = llama_cases::small_config();
    c.vocabulary = 30;  // padded to 32 at TP 4; the padding must not change the loss
    check_against_serial("vocabulary 30 at TP 4", serial_run(c), 4, 1, sequence_parallel{}, c, 1);
  }
  {
    auto const c = llama_cases::small_config();
    check_against_serial("2 micro-batches, dp 2 x tp 2", serial_run(c), 4, 2, sequence_parallel{}, c, 2);
  }
}

// optimum-neuron's "layers to leave alone", as a compile-time predicate on plan paths.
struct leave_feed_forward_alone {
  static constexpr bool matches(std::string_view path) { return path.starts_with("layers.*.feed_forward"); }
};
static_assert(
    std::is_same_v<shardwise::detail::lookup_style<shardwise::models::llama_plan<false, true, leave_feed_forward_alone>,
                                                   "layers.*.feed_forward.w1">::type,
                   shardwise::NoParallel>);

TEST_CASE("Llama: feed-forwards left alone by a predicate train like the unsharded run") {
  auto const c = llama_cases::small_config();
  llama_cases::Run serial;
  shardwise::run_threads(
      1, [&](auto& world) { serial = llama_cases::train<shardwise::serial_plan>(world, 1, steps, false, c); });
  using Plan = shardwise::models::llama_plan<false, true, leave_feed_forward_alone>;
  shardwise::run_threads(2, [&](auto& world) {
    auto const run = llama_cases::train<Plan>(world, 1, steps, false, c);
    if (world.rank() == 0) llama_cases::check_same_run(run, serial);
  });
}

TEST_CASE("Llama: a tp size the heads cannot serve is refused with the reason") {
  auto c = llama_cases::small_config();
  c.heads = 6, c.kv_heads = 3, c.dim = 36;  // 4 ranks: neither 6 heads nor 3 key-value heads split
  shardwise::run_threads(4, [&](auto& world) {
    auto const tp = shardwise::make_mesh<"tp">(world, {4});
    shardwise::models::Llama<float, shardwise::models::llama_plan<true>> model(c);
    CHECK_THROWS_WITH_AS(shardwise::parallelize(model, tp),
                         "shardwise::models::Llama at \"layers.*.attention\": 4 ranks cannot serve 6 heads and 3 "
                         "key-value heads with kv_size_multiplier 0 (0: derived); the heads must divide over the "
                         "ranks, and the ranks must divide the key-value heads or be a multiple of them: choose "
                         "another tp size",
                         shardwise::error);
  });
  c = llama_cases::small_config();
  c.heads = 8, c.kv_heads = 2, c.kv_size_multiplier = 3;  // 6 repeated heads do not split over 4 ranks
  shardwise::run_threads(4, [&](auto& world) {
    auto const tp = shardwise::make_mesh<"tp">(world, {4});
    shardwise::models::Llama<float, shardwise::models::llama_plan<true>> model(c);
    CHECK_THROWS_WITH_AS(shardwise::parallelize(model, tp),
                         doctest::Contains("4 ranks cannot serve 8 heads and 2 key-value heads with "
                                           "kv_size_multiplier 3"),
                         shardwise::error);
  });
}

// kv_size_multiplier at compile time: derived when tp exceeds the key-value heads, 0 (refused) when no
// repetition lets each rank hold the key-value heads of its query heads.
static_assert(shardwise::models::kv_size_multiplier(4, 4, 2) == 1);
static_assert(shardwise::models::kv_size_multiplier(4, 1, 4) == 4);
static_assert(shardwise::models::kv_size_multiplier(8, 2, 4) == 2);
static_assert(shardwise::models::kv_size_multiplier(32, 8, 16) == 2);
static_assert(shardwise::models::kv_size_multiplier(6, 3, 4) == 0);   // heads do not split
static_assert(shardwise::models::kv_size_multiplier(12, 3, 4) == 0);  // rank 1's query heads need two kv heads
static_assert(shardwise::models::kv_size_multiplier(8, 2, 4, 3) == 0);
