// The GPT-2 model trained sharded on the thread mesh: 50 steps with AdamW parameter groups and global-norm
// clipping on every step, loss curve and final parameters equal to the unsharded run (fp32; losses and norms
// 1e-4 relative, parameters as llama_cases::check_same_run states, but for the key biases: see
// gpt2_cases::without_key_biases) for TP 2, TP 4, TP 2 and TP 4 with sequence parallelism and dp 2 x tp 2 with
// ZeRO-1; the sequences cut over cp (ring and all-to-all, with dp, tp and sequence parallelism; uneven cuts); a
// padded vocabulary and padded positions; the tie (one tensor); heads that do not divide over tp refused with the
// reason.
#include <doctest/doctest.h>

#include "cases/gpt2_cases.hpp"
#include "support/worlds.hpp"

namespace {
int const steps = llama_cases::steps();
namespace sw = shardwise;
namespace models = shardwise::models;
using tp_only = std::type_identity<models::gpt2_plan<false>>;
using sequence_parallel = std::type_identity<models::gpt2_plan<true>>;

gpt2_cases::Run serial_run(models::GPT2Config const& c) {
  gpt2_cases::Run run;
  worlds::run_threads(1, [&](auto& world) { run = gpt2_cases::train<sw::serial_plan>(world, 1, steps, false, c); });
  return run;
}

template <class PlanTag>
void check_against(char const* name, gpt2_cases::Run const& serial, int ranks, int dp, bool zero1, PlanTag,
                   models::GPT2Config const& c, gpt2_cases::context_cut cut = {}) {
  INFO(std::string(name));
  worlds::run_threads(ranks, [&](auto& world) {
    auto const run =
        gpt2_cases::train<typename PlanTag::type>(world, dp, steps, zero1, c, gpt2_cases::max_grad_norm, cut);
    if (world.rank() != 0) return;
    gpt2_cases::check_same_training(run, serial);
  });
}
}  // namespace

TEST_CASE("GPT-2: sharded training equals the unsharded run, thread mesh") {
  auto const c = gpt2_cases::small_config();
  auto const serial = serial_run(c);
  CHECK(serial.losses.back() < serial.losses.front());  // it learns
  for (std::size_t i = 0; i < serial.norms.size(); ++i) {
    INFO("step " << i << ": AdamW's norm " << serial.norms[i] << ", the gradients' own " << serial.own_norms[i]);
    CHECK(std::abs(serial.norms[i] - serial.own_norms[i]) <= 1e-5 * serial.own_norms[i]);
    CHECK(serial.norms[i] > gpt2_cases::max_grad_norm);  // clipping engaged on every step
  }
  check_against("TP 2", serial, 2, 1, false, tp_only{}, c);
  check_against("TP 4", serial, 4, 1, false, tp_only{}, c);
  check_against("TP 2 with sequence parallelism", serial, 2, 1, false, sequence_parallel{}, c);
  check_against("TP 4 with sequence parallelism", serial, 4, 1, false, sequence_parallel{}, c);
  check_against("dp 2 x tp 2 with ZeRO-1", serial, 4, 2, true, sequence_parallel{}, c);
}

TEST_CASE("GPT-2 with its sequences cut over cp equals the unsharded run, thread mesh") {
  auto c = gpt2_cases::small_config();
  c.sequence = 9;  // over cp 2: head-tail chunks of 3, 2, 2 and 2 tokens, 5 on rank 0 and 4 on rank 1
  auto const serial = serial_run(c);
  auto const ring = sw::context_method::ring;
  check_against("cp 2, ring", serial, 2, 1, false, tp_only{}, c, {2, ring});
  check_against("cp 2, all-to-all", serial, 2, 1, false, tp_only{}, c, {2, sw::context_method::all_to_all});
  check_against("cp 4, ring", serial, 4, 1, false, tp_only{}, c, {4, ring});
  check_against("dp 2 x cp 2, ring, ZeRO-1 over dp x cp", serial, 4, 2, true, tp_only{}, c, {2, ring});
  check_against("cp 2 x tp 2 with sequence parallelism, ring", serial, 4, 1, false, sequence_parallel{}, c, {2, ring});
}

TEST_CASE("GPT-2 under cp: a split of another sequence length, and a cached forward, are refused") {
  auto const c = gpt2_cases::small_config();
  worlds::run_threads(2, [&](auto& world) {
    auto const cp = sw::make_mesh<"cp">(world, {2});
    models::GPT2<float> model(c);
    CHECK_THROWS_WITH_AS(sw::context_parallelize(model, cp, {9, 2}),
                         doctest::Contains("the context_split cuts sequences of 9 tokens but the model's are 8"),
                         sw::error);
    (void)sw::context_parallelize(model, cp, {8, 2});
    std::vector<std::int64_t> const six(6, 1);  // neither sequences of 8 nor this rank's 4-token pieces
    CHECK_THROWS_WITH_AS((void)model.forward(six),
                         doctest::Contains("6 ids are not whole sequences of 4 tokens (this cp"), sw::error);
    sw::kv_cache<float> cache(model.shardwise_kv_shape(), 1, 8);
    std::vector<std::int64_t> const prompt(3, 1);
    std::vector<std::size_t> const first{0}, three{3};
    CHECK_THROWS_WITH_AS((void)model.forward(prompt, cache.append(first, three), cache),
                         doctest::Contains("a forward with a key-value cache on a model cut over cp"), sw::error);
  });
}

TEST_CASE("GPT-2: a padded vocabulary and padded positions train like the unsharded run") {
  auto c = gpt2_cases::small_config();
  c.vocabulary = 30;  // padded to 32 at TP 4 (the tied table, once, by wte)
  c.sequence = 6;     // under sequence parallelism wpe is cut by positions: padded to 8 at TP 4
  check_against("vocabulary 30, sequence 6 at TP 4 with sequence parallelism", serial_run(c), 4, 1, false,
                sequence_parallel{}, c);
}

TEST_CASE("GPT-2: lm_head is wte, one tensor under wte's name") {
  auto const c = gpt2_cases::small_config();
  models::GPT2<float> model(c);
  CHECK(model.lm_head.tied());
  CHECK(model.lm_head.tied_to() == "wte");
  std::vector<std::string> names;
  sw::for_each_parameter(model, [&](std::string const& name, auto const&) { names.push_back(name); });
  std::vector<std::string> const expected_first{
      "wte.weight", "wpe.weight", "h.0.ln_1.weight", "h.0.ln_1.bias", "h.0.attn.q_proj.weight", "h.0.attn.q_proj.bias"};
  REQUIRE(names.size() == 2 + 16 * c.layers + 2);  // wte, wpe; 16 per block; ln_f weight and bias
  CHECK(std::vector<std::string>(names.begin(), names.begin() + 6) == expected_first);
  CHECK(names[names.size() - 2] == "ln_f.weight");
  CHECK(names.back() == "ln_f.bias");
  for (auto const& name : names) CHECK(name.find("lm_head") == std::string::npos);
}

TEST_CASE("GPT-2: the key biases' gradient is rounding only, so the comparisons may leave them out") {
  auto const c = gpt2_cases::small_config();
  models::GPT2<float> model(c);
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  sw::parallelize(model, tp);
  std::vector<std::int64_t> ids, targets;
  gpt2_cases::batch(c, 0, 4, 0, 4, ids, targets);
  model.backward(models::gpt2_loss(tp, model.forward(ids), targets, c.vocabulary).dlogits);
  for (auto const& block : model.h) {
    INFO("key bias gradient " << block.attn.k_proj.bias_grad.norm() << ", query bias gradient "
                              << block.attn.q_proj.bias_grad.norm());
    CHECK(block.attn.k_proj.bias_grad.norm() < 1e-5 * block.attn.q_proj.bias_grad.norm());
  }
}

TEST_CASE("GPT-2: heads that do not divide over tp are refused with the reason") {
  auto c = gpt2_cases::small_config();
  c.heads = 2, c.dim = 32;  // 2 heads at 4 ranks
  worlds::run_threads(4, [&](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {4});
    models::GPT2<float, models::gpt2_plan<true>> model(c);
    CHECK_THROWS_WITH_AS(sw::parallelize(model, tp),
                         "shardwise::models::GPT2 at \"h.*.attn\": 2 heads do not divide over 4 ranks; each rank "
                         "computes whole heads: choose a tp size that divides the heads",
                         sw::error);
  });
  c.heads = 5;
  CHECK_THROWS_WITH_AS(models::GPT2<float>{c},
                       "shardwise::models::GPT2: dim 32 does not divide into 5 heads; choose a dim that is a multiple "
                       "of the heads",
                       sw::error);
}
