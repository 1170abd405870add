// Generation with the key-value cache on the thread mesh at tp 1, 2 and 4 (generate_cases): Llama (grouped-query,
// and with kv_size_multiplier), GPT-2 and a user's decoder, every step's logits against the unsharded full
// forward; sampling's tokens the same at every tp size; stop tokens; the cache's bytes against its formula; the
// sampling rule on hand-worked cases; every bad request refused on every rank.
#include <doctest/doctest.h>

#include "cases/generate_cases.hpp"
#include "support/worlds.hpp"

namespace {
namespace sw = shardwise;
namespace models = shardwise::models;
using namespace generate_cases;

Generated sampled_at_tp1() {
  Generated g;
  worlds::run_threads(1, [&](auto& world) { g = llama<float>(world, llama_config(), sampled()); });
  return g;
}
}  // namespace

TEST_CASE("generate: every step equals the full forward, and sampling is the same at tp 1, 2 and 4 (threads)") {
  auto const alone = sampled_at_tp1();
  CHECK(alone.tokens != llama<float>(sw::serial_world(), llama_config(), greedy()).tokens);  // it samples
  for (int ranks : {1, 2, 4}) worlds::run_threads(ranks, [&](auto& world) { all_cases(world, alone); });
}

TEST_CASE("generate: a stop token ends its sequence, the others go on") {
  auto const p = prompts(61);
  Generated full, stopped;
  std::int64_t stop = 0;
  worlds::run_threads(2, [&](auto& world) {
    auto const g = llama<float>(world, llama_config(), greedy());
    auto o = greedy();
    o.stop_tokens = {g.tokens[1][3]};
    auto const s = llama<float>(world, llama_config(), o);
    if (world.rank() == 0) full = g, stopped = s, stop = o.stop_tokens[0];
  });
  for (std::size_t i = 0; i < p.size(); ++i) {
    auto const end = std::find(full.tokens[i].begin(), full.tokens[i].end(), stop);
    std::vector<std::int64_t> const expected(full.tokens[i].begin(), end == full.tokens[i].end() ? end : end + 1);
    CHECK(stopped.tokens[i] == expected);
  }
  CHECK(stopped.tokens[1].size() <= 4);
}

TEST_CASE("generate: the cache holds 2 x layers x local key-value columns x capacity x sequences elements") {
  for (int ranks : {1, 2, 4})
    for (std::size_t kv_heads : {std::size_t{2}, std::size_t{1}})
      worlds::run_threads(ranks, [&](auto& world) {
        auto const c = llama_config(kv_heads);
        auto const tp = tp_mesh(world);
        models::Llama<float, models::llama_plan<false>> model(c);
        sw::parallelize(model, tp);
        auto const g = sw::generate(model, tp, prompts(61), {.max_new_tokens = 3, .capacity = 30});
        // this rank's key-value heads: kv_heads, repeated up to tp where tp is larger, cut over tp
        std::size_t const local_heads = std::max<std::size_t>(kv_heads, std::size_t(ranks)) / std::size_t(ranks);
        CHECK(g.cache_bytes == 2 * c.layers * local_heads * c.head_dim() * 30 * 3 * sizeof(float));
      });
}

TEST_CASE("sample_token: greedy, temperature, top-k and top-p on hand-worked probabilities") {
  // Logits log 1..4: probabilities 0.1, 0.2, 0.3, 0.4.
  std::vector<float> const logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  auto pick = [&](sw::sampling s, double draw) { return sw::sample_token(std::span<const float>(logits), s, draw); };
  CHECK(pick({}, 0.0) == 3);
  CHECK(sw::sample_token(std::span<const float>(std::vector<float>{1, 5, 5, 2}), {}, 0.0) == 1);  // first maximum
  sw::sampling const plain{.temperature = 1};
  CHECK(pick(plain, 0.05) == 0);
  CHECK(pick(plain, 0.15) == 1);
  CHECK(pick(plain, 0.35) == 2);
  CHECK(pick(plain, 0.65) == 3);
  CHECK(pick({.temperature = 0.5}, 0.1) == 1);            // probabilities 1, 4, 9, 16 over 30: cumulative 5/30
  CHECK(pick({.temperature = 1, .top_k = 2}, 0.4) == 2);  // 3/7, 4/7
  CHECK(pick({.temperature = 1, .top_k = 2}, 0.45) == 3);
  CHECK(pick({.temperature = 1, .top_p = 0.75}, 0.2) == 1);  // cumulative 0.1 <= 0.25 removed: 2/9, 3/9, 4/9
  CHECK(pick({.temperature = 1, .top_p = 0.75}, 0.05) == 1);
  CHECK(pick({.temperature = 1, .top_p = 0.6}, 0.0) == 2);   // 0.1 and 0.3 <= 0.4 removed: 3/7, 4/7
  CHECK(pick({.temperature = 1, .top_p = 0.3}, 0.99) == 3);  // only the most likely left
}

TEST_CASE("generate: bad requests are refused on every rank with the same words (threads)") {
  for (int ranks : {1, 2, 4}) worlds::run_threads(ranks, [&](auto& world) { bad_requests(world); });
}
