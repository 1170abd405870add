#pragma once
// Generation with the key-value cache, shared by the thread-mesh file (test_generate.cpp) and the MPI file
// (test_mpi_generate.cpp): every step's logits of sw::generate (prefill, then decode over the cache) against the
// same model's training forward over the whole sequence so far, which recomputes everything (the reference's
// rows are the positions generate predicted from); the tokens, greedy, against that forward's argmax; the
// bad-input errors, the same on every rank; a MoeLlama whose experts are placed over the ranks.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <shardwise/inference.hpp>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "../examples/blocks.hpp"

namespace generate_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
using prompt_list = std::vector<std::vector<std::int64_t>>;

/// Grouped-query Llama (4 heads, 2 key-value heads; kv_heads 1 needs kv_size_multiplier at tp 2 and 4), a
/// vocabulary tp 2 and 4 do not divide (padded), config().sequence shorter than the cache (RoPE's tables grow).
inline models::LlamaConfig llama_config(std::size_t kv_heads = 2) {
  models::LlamaConfig c;
  c.vocabulary = 61, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = kv_heads, c.hidden = 48, c.sequence = 8;
  return c;
}

/// GPT-2 with the tied head and a vocabulary tp 2 and 4 do not divide; 40 positions.
inline models::GPT2Config gpt2_config() {
  models::GPT2Config c;
  c.vocabulary = 61, c.dim = 32, c.layers = 2, c.heads = 4, c.sequence = 40;
  return c;
}

/// Three prompts of 5, 1 and 9 tokens.
inline prompt_list prompts(std::size_t vocabulary) {
  prompt_list p{{}, {}, {}};
  std::size_t const lengths[] = {5, 1, 9};
  for (std::size_t i = 0; i < 3; ++i)
    for (std::size_t t = 0; t < lengths[i]; ++t)
      p[i].push_back(static_cast<std::int64_t>((i * 17 + t * 29 + 3) % vocabulary));
  return p;
}

/// What a generation produced: the tokens, and every step's logits per prompt ([prompt][step][vocabulary]).
struct Generated {
  prompt_list tokens;
  std::vector<std::vector<std::vector<double>>> logits;
};

/// sw::generate on `model`, keeping each step's logits.
template <class Model, class Tp>
Generated generate_logged(Model& model, Tp const& tp, prompt_list const& prompts, sw::generation_options const& o) {
  Generated g;
  g.logits.resize(prompts.size());
  auto keep = [&](std::size_t, std::span<const std::size_t> sequences, auto const& logits) {
    for (std::size_t r = 0; r < sequences.size(); ++r) {
      auto& row = g.logits[sequences[r]].emplace_back();
      for (Eigen::Index j = 0; j < logits.cols(); ++j) row.push_back(double(logits(static_cast<Eigen::Index>(r), j)));
    }
  };
  g.tokens = sw::generate(model, tp, prompts, o, keep).tokens;
  return g;
}

/// The logits of every position of `ids` from the unsharded model's training forward over the whole sequence
/// (built by `make(length)`: config().sequence set to the length), as rows of doubles.
template <class Make>
std::vector<std::vector<double>> full_logits(Make&& make, std::vector<std::int64_t> const& ids) {
  auto model = make(ids.size());
  auto const logits = model.forward(ids);
  std::vector<std::vector<double>> rows(ids.size());
  for (std::size_t i = 0; i < ids.size(); ++i)
    for (Eigen::Index j = 0; j < logits.local.cols(); ++j)
      rows[i].push_back(double(logits.local(static_cast<Eigen::Index>(i), j)));
  return rows;
}

/// Every step's logits of `g` against the unsharded full forward over the prompt and the tokens generated before
/// that step (max |difference| / max |reference| per step at most `tolerance`), and each greedy token against
/// that forward's argmax.
template <class Make>
void check_against_full(Generated const& g, prompt_list const& prompts, int max_new_tokens, double tolerance,
                        Make&& make) {
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    REQUIRE(g.tokens[i].size() == static_cast<std::size_t>(max_new_tokens));
    std::vector<std::int64_t> ids = prompts[i];
    ids.insert(ids.end(), g.tokens[i].begin(), g.tokens[i].end() - 1);
    auto const full = full_logits(make, ids);
    double worst = 0;
    for (std::size_t t = 0; t < g.tokens[i].size(); ++t) {
      auto const& expected = full[prompts[i].size() - 1 + t];
      auto const& got = g.logits[i][t];
      REQUIRE(got.size() == expected.size());
      double diff = 0, scale = 0;
      for (std::size_t j = 0; j < got.size(); ++j)
        diff = std::max(diff, std::abs(got[j] - expected[j])), scale = std::max(scale, std::abs(expected[j]));
      worst = std::max(worst, diff / scale);
      auto const argmax = std::max_element(expected.begin(), expected.end()) - expected.begin();
      CHECK(g.tokens[i][t] == argmax);
    }
    INFO("worst relative difference " << worst);
    CHECK(worst <= tolerance);
  }
}

/// Greedy generation of 24 tokens after each of the three prompts.
inline sw::generation_options greedy() { return {.max_new_tokens = 24}; }
/// Sampling with every filter on.
inline sw::generation_options sampled() {
  return {.max_new_tokens = 24, .temperature = 0.8, .top_k = 20, .top_p = 0.9, .seed = 7};
}

/// The tp mesh over the whole world.
template <class World>
auto tp_mesh(World const& world) {
  return sw::submesh<"tp">(sw::make_mesh<"tp">(world, {world.size()}));
}

/// Model (a plan type) built from `c`, parallelized over the whole world, generating after prompts(c.vocabulary).
template <class Model, class World, class Config>
Generated generate_planned(World const& world, Config const& c, sw::generation_options const& o) {
  auto const tp = tp_mesh(world);
  Model model(c);
  sw::parallelize(model, tp);
  return generate_logged(model, tp, prompts(c.vocabulary), o);
}

/// For full_logits: the unsharded Model built from `c` with c.sequence set to the length asked for (GPT-2's wpe
/// then holds that many positions: the same first rows as the generating model's, its table drawn row after row
/// from the same seed).
template <class Model, class Config>
auto reference_of(Config c) {
  return [c](std::size_t length) mutable {
    c.sequence = length;
    return Model(c);
  };
}

/// Llama<T> under llama_plan<false> at the world's size.
template <class T, class World>
Generated llama(World const& world, models::LlamaConfig const& c, sw::generation_options const& o) {
  return generate_planned<models::Llama<T, models::llama_plan<false>>>(world, c, o);
}
/// The unsharded Llama<T> for full_logits.
template <class T>
auto llama_reference(models::LlamaConfig const& c) {
  return reference_of<models::Llama<T>>(c);
}
/// GPT2<T> under gpt2_plan<false> at the world's size.
template <class T, class World>
Generated gpt2(World const& world, models::GPT2Config const& c, sw::generation_options const& o) {
  return generate_planned<models::GPT2<T, models::gpt2_plan<false>>>(world, c, o);
}
/// The unsharded GPT2<T> for full_logits.
template <class T>
auto gpt2_reference(models::GPT2Config const& c) {
  return reference_of<models::GPT2<T>>(c);
}

/// A decoder of a user's own: embedding, the user's attention (examples/blocks.hpp, which takes the cache), a
/// residual, an output projection; the tp plan cuts the attention's heads.
template <class T, class Plan = sw::serial_plan>
struct TinyDecoder {
  struct settings {
    std::size_t vocabulary = 61, dim = 32, heads = 4, sequence = 8;
  };
  sw::Embedding<T, sw::layer_at<Plan, "embed">> embed;
  blocks::Attention<T, sw::subplan<Plan, "attention">> attention;
  sw::Linear<T, sw::layer_at<Plan, "head">> head;
  SHARDWISE_CHILDREN(embed, attention, head)
  SHARDWISE_SAVED()

  explicit TinyDecoder(settings const& c)
      : embed(c.vocabulary, c.dim, 11),
        attention(c.dim, c.heads, c.sequence, 12),
        head(c.dim, c.vocabulary, 13),
        config_(c) {}
  settings const& config() const { return config_; }

  /// The training forward: whole sequences of config().sequence tokens.
  auto forward(std::span<const std::int64_t> ids) {
    auto x = embed(ids);
    return head(x + sw::forward(attention, x));
  }
  /// The forward with the cache: the last row of each entry.
  auto forward(std::span<const std::int64_t> ids, sw::cache_step const& step, sw::kv_cache<T>& cache) {
    auto x = embed(ids);
    auto h = x + sw::forward(attention, x, step, cache.layer(0));
    decltype(h) last{h.local(step.last_rows(), Eigen::all)};
    return head(last);
  }
  sw::kv_cache_shape shardwise_kv_shape() const {  // this rank's key columns: its heads
    return {1, static_cast<std::size_t>(attention.wk.weight.rows()), attention.heads.head_dim};
  }

 private:
  settings config_;
};

/// The tiny decoder's tensor-parallel plan: the attention's heads cut, the rest whole.
using tiny_plan =
    sw::plan<sw::at<"attention.wq", sw::ColwiseParallel<>>, sw::at<"attention.wk", sw::ColwiseParallel<>>,
             sw::at<"attention.wv", sw::ColwiseParallel<>>, sw::at<"attention.wo", sw::RowwiseParallel<>>>;

template <class World>
Generated tiny(World const& world, sw::generation_options const& o) {
  return generate_planned<TinyDecoder<float, tiny_plan>>(world, TinyDecoder<float, tiny_plan>::settings{}, o);
}

inline auto tiny_reference() { return reference_of<TinyDecoder<float>>(TinyDecoder<float>::settings{}); }

/// The message of the sw::error `fn` throws ("" when it does not throw).
template <class Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (sw::error const& e) {
    return e.what();
  }
  return "";
}

/// Each bad request is refused before any work, on every rank, with the words that name it and the fix (the
/// same on every rank: each rank checks them).
template <class World>
void bad_requests(World const& world) {
  auto const tp = tp_mesh(world);
  models::Llama<float, models::llama_plan<false>> model(llama_config());
  sw::parallelize(model, tp);
  auto const p = prompts(61);
  auto refused = [&](prompt_list const& given, sw::generation_options const& o, std::string const& words) {
    std::string const message = error_of([&] { (void)sw::generate(model, tp, given, o); });
    INFO(message);
    CHECK(message.find(words) != std::string::npos);
  };
  refused(p, {.max_new_tokens = 24, .capacity = 30},
          "prompt 2 has 9 tokens, and with max_new_tokens 24 it needs 33 "
          "positions, more than the cache's capacity of 30");
  refused({{1, 2}, {}}, {}, "prompt 1 is empty; give every prompt at least one token id");
  refused({{1, 61}}, {}, "token 61 at position 1 of prompt 0 is outside the vocabulary [0, 61)");
  refused({{-1}}, {}, "token -1 at position 0 of prompt 0 is outside the vocabulary");
  refused(p, {.max_new_tokens = 0}, "max_new_tokens is 0; give at least 1");
  refused(p, {.max_new_tokens = -3}, "max_new_tokens is -3; give at least 1");
  refused(p, {.temperature = 1, .top_p = 0}, "top_p 0 is outside (0, 1]");
  refused(p, {.temperature = 1, .top_p = 1.5}, "top_p 1.5 is outside (0, 1]");
  refused(p, {.temperature = -1}, "temperature -1 is not a finite number >= 0");
  refused(p, {.top_k = -2}, "top_k -2 is negative");
  refused({}, {}, "no prompts; give at least one prompt of token ids");
  if (world.size() > 1) {  // rank 1 is given another prompt, then another seed
    prompt_list mine = p;
    if (tp.rank() == 1) mine[0][0] = (mine[0][0] + 1) % 61;
    refused(mine, {}, "were given different prompts or options: rank 0 has 3 prompts of 15 tokens");
    refused(p, {.temperature = 1, .seed = tp.rank() == 1 ? 2u : 1u}, "Give every rank the same prompts and options");
  }
  sw::generation_options ok{.max_new_tokens = 2};  // the model is still usable after the refusals
  CHECK(sw::generate(model, tp, p, ok).tokens.size() == 3);
}

/// The same tokens (sampled or greedy) from two runs.
inline void check_same_tokens(Generated const& got, Generated const& expected) {
  REQUIRE(got.tokens.size() == expected.tokens.size());
  for (std::size_t i = 0; i < got.tokens.size(); ++i) {
    INFO("prompt " << i);
    CHECK(got.tokens[i] == expected.tokens[i]);
  }
}

/// Every generation case at the world's size (fp32: logits within 1e-5 of the full forward, relative to the
/// step's largest logit; measured below 1e-6), and sampling's tokens equal to `sampled_alone` (tp 1's).
template <class World>
void all_cases(World const& world, Generated const& sampled_alone) {
  constexpr double tolerance = 1e-5;
  int const n = greedy().max_new_tokens;
  auto const p = prompts(61);
  for (std::size_t kv_heads : {std::size_t{2}, std::size_t{1}}) {
    INFO("Llama, " << kv_heads << " key-value heads, tp " << world.size());
    auto const c = llama_config(kv_heads);
    check_against_full(llama<float>(world, c, greedy()), p, n, tolerance, llama_reference<float>(c));
  }
  {
    INFO("GPT-2, tp " << world.size());
    check_against_full(gpt2<float>(world, gpt2_config(), greedy()), p, n, tolerance,
                       gpt2_reference<float>(gpt2_config()));
  }
  {
    INFO("a user's decoder with its own attention, tp " << world.size());
    check_against_full(tiny(world, greedy()), p, n, tolerance, tiny_reference());
  }
  INFO("sampling, tp " << world.size());
  check_same_tokens(llama<float>(world, llama_config(), sampled()), sampled_alone);
}

/// For full_logits: the unsharded Llama<float> built from `c` with every Linear's weight rounded to bf16 by
/// Eigen::bfloat16 (the embedding's table as it was).
inline auto llama_bf16_reference(models::LlamaConfig const& c) {
  return [c](std::size_t length) {
    auto model = llama_reference<float>(c)(length);
    shardwise::detail::for_each_layer(model, [](auto& layer) {
      if constexpr (requires { layer.shardwise_reset_precision(); })  // a Linear: what sw::bf16_weights sets
        layer.weight = layer.weight.template cast<Eigen::bfloat16>().template cast<float>();
    });
    return model;
  };
}

/// Under sw::bf16_weights, every step's logits equal the unsharded full forward of the Llama whose Linear weights
/// were rounded to bf16 (the same tolerance as fp32: only the order of the sums differs) and differ from the fp32
/// model's by far more; a backward is refused; after the scope, fp32 again.
template <class World>
void bf16_weights_cases(World const& world) {
  constexpr double tolerance = 1e-5;
  auto const c = llama_config();
  auto const tp = tp_mesh(world);
  auto const p = prompts(c.vocabulary);
  int const n = greedy().max_new_tokens;
  models::Llama<float, models::llama_plan<false>> model(c);
  sw::parallelize(model, tp);
  Generated bf16;
  {
    sw::bf16_weights const copies(model);
    CHECK(copies.layers() == 7 * c.layers + 1);  // wq, wk, wv, wo, w1, w2, w3 per block, and the output
    CHECK(copies.bytes() > 0);
    bf16 = generate_logged(model, tp, p, greedy());
    std::vector<std::int64_t> ids(c.sequence, 1);
    auto const logits = model.forward(ids);
    CHECK(error_of([&] { model.backward(logits); }).find("backward while it computes with bf16 weights") !=
          std::string::npos);
  }
  INFO("Llama with bf16 weights, tp " << world.size());
  check_against_full(bf16, p, n, tolerance, llama_bf16_reference(c));
  Generated const fp32 = generate_logged(model, tp, p, greedy());
  check_against_full(fp32, p, n, tolerance, llama_reference<float>(c));
  double differs = 0, scale = 0;  // the first step of each prompt (the same tokens so far): bf16 against fp32
  for (std::size_t i = 0; i < p.size(); ++i)
    for (std::size_t j = 0; j < bf16.logits[i][0].size(); ++j) {
      differs = std::max(differs, std::abs(bf16.logits[i][0][j] - fp32.logits[i][0][j]));
      scale = std::max(scale, std::abs(fp32.logits[i][0][j]));
    }
  INFO("bf16 against fp32: " << differs / scale);
  CHECK(differs / scale > 30 * tolerance);
}

/// A MoeLlama (2 blocks of 8 experts, top-2) with its experts placed over every rank, each rank generating the same
/// prompts: every step's logits equal the unsharded model's full forward (fp64, 1e-12) and the greedy tokens its
/// argmax, as unplaced; prompts that differ on one ep rank are refused on every rank with the same words.
template <class World>
void placed_experts(World const& world) {
  models::LlamaConfig c;
  c.vocabulary = 40, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.sequence = 8, c.seed = 3;
  models::MoeConfig experts;
  experts.experts = 8, experts.top_k = 2, experts.expert_hidden = 12, experts.normalize_top_k = true;
  c.moe = experts;
  auto const ep = sw::make_mesh<"ep">(world, {world.size()});
  auto const tp = sw::submesh<"tp">(sw::make_mesh<"tp">(sw::serial_world(), {1}));
  models::MoeLlama<double> model(c);
  (void)sw::expert_parallelize(model, ep);
  auto const p = prompts(c.vocabulary);
  sw::generation_options const o{.max_new_tokens = 6};
  INFO("MoeLlama, experts over ep " << world.size());
  check_against_full(generate_logged(model, tp, p, o), p, o.max_new_tokens, 1e-12,
                     reference_of<models::MoeLlama<double>>(c));
  if (world.size() == 1) return;
  prompt_list other = p;
  if (world.rank() == world.size() - 1) other[0][0] = (other[0][0] + 1) % 40;
  CHECK(error_of([&] { (void)sw::generate(model, tp, other, o); }) ==
        "shardwise::generate: the ranks of mesh axis \"ep\", over which the model's experts are placed, were given "
        "different prompts or options; every ep rank computes its experts for the tokens of all, so they generate "
        "together: give every ep rank the same prompts and options");
}

}  // namespace generate_cases
