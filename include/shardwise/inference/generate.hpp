#pragma once
// sw::generate: batched text generation with a key-value cache, on a tensor-parallel model or an unsharded one,
// on threads or under mpiexec with the same code. The prompts (of different lengths) go in at once: one prefill
// forward of all their tokens, packed without padding; then one decode forward per new token over the sequences
// still running, so that a sequence that stops early (a stop token, or max_new_tokens) costs nothing after. Every
// rank of the tp group gathers the same whole logits and draws the same numbers, so all pick the same tokens.
//
//   sw::generation g = sw::generate(model, tp, {{1, 15, 7}, {3, 4}}, {.max_new_tokens = 64});
//   g.tokens[0];  // the first prompt's new tokens
#include <algorithm>
#include <bit>
#include <chrono>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/fold_hash.hpp"
#include "shardwise/inference/kv_cache.hpp"
#include "shardwise/inference/sampling.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/experts/expert_parallel.hpp"
#include "shardwise/nn/module_call.hpp"
#include "shardwise/nn/redistribute.hpp"

namespace shardwise {

/// What generate does (transformers' generate arguments where it has them).
struct generation_options {
  int max_new_tokens = 32;                  ///< New tokens per prompt at most; at least 1.
  double temperature = 0;                   ///< 0: greedy; else sampling (see sw::sampling).
  std::int64_t top_k = 0;                   ///< Sampling's top-k filter; 0: off.
  double top_p = 1.0;                       ///< Sampling's top-p (nucleus) filter, in (0, 1]; 1: off.
  std::uint64_t seed = 0;                   ///< Seed of the draws (sw::token_draws).
  std::vector<std::int64_t> stop_tokens{};  ///< A sequence ends after producing one of these (kept in its tokens).
  /// Positions per sequence in the cache (prompt and new tokens); 0: the longest prompt + max_new_tokens.
  std::size_t capacity = 0;
};

/// What generate produced, and how long it took on this rank.
struct generation {
  std::vector<std::vector<std::int64_t>> tokens{};  ///< Per prompt, its new tokens (a stop token included).
  double first_token_seconds = 0;                   ///< The prefill forward and the first tokens.
  double decode_seconds = 0;                        ///< Every later step.
  std::size_t decoded_tokens = 0;                   ///< Tokens the later steps produced.
  std::size_t cache_bytes = 0;                      ///< The key-value cache on this rank (kv_cache::bytes).
  /// Tokens per second after the first (0 when there were none).
  [[nodiscard]] double decode_tokens_per_second() const {
    return decode_seconds > 0 ? static_cast<double>(decoded_tokens) / decode_seconds : 0;
  }
};

/// A model generate can run: forward(ids, cache_step, kv_cache<T>&) giving one row of logits per entry,
/// shardwise_kv_shape() (the cache it needs on this rank) and config().vocabulary (the logits' real columns).
template <class Model, class T>
concept cached_decoder =
    requires(Model& m, std::span<const std::int64_t> ids, cache_step const& step, kv_cache<T>& cache) {
      { m.shardwise_kv_shape() } -> std::convertible_to<kv_cache_shape>;
      { m.config().vocabulary } -> std::convertible_to<std::size_t>;
      m.forward(ids, step, cache);
    };

namespace detail {

/// The element type of a model's cached forward: float if it takes a kv_cache<float>, else double.
template <class Model>
using decoder_element_t = std::conditional_t<cached_decoder<Model, float>, float, double>;

/// What every rank of the tp group must agree on before generating: its prompts and options, fingerprinted.
struct generation_request {
  std::uint64_t hash = 0;
  std::uint64_t prompts = 0, tokens = 0;
};

inline generation_request describe_request(std::vector<std::vector<std::int64_t>> const& prompts,
                                           generation_options const& o) {
  generation_request r;
  std::uint64_t h = fold_hash(0, prompts.size());
  for (auto const& p : prompts) {
    h = fold_hash(h, p.size()), r.tokens += p.size();
    for (std::int64_t id : p) h = fold_hash(h, static_cast<std::uint64_t>(id));
  }
  h = fold_hash(h, static_cast<std::uint64_t>(o.max_new_tokens));
  h = fold_hash(fold_hash(h, std::bit_cast<std::uint64_t>(o.temperature)), static_cast<std::uint64_t>(o.top_k));
  h = fold_hash(fold_hash(h, std::bit_cast<std::uint64_t>(o.top_p)), o.seed);
  h = fold_hash(fold_hash(h, o.capacity), o.stop_tokens.size());
  for (std::int64_t id : o.stop_tokens) h = fold_hash(h, static_cast<std::uint64_t>(id));
  r.hash = h, r.prompts = prompts.size();
  return r;
}

/// Refuses, on every rank with the same words, prompts or options that differ across the tp group.
template <class Mesh>
void agree_on_request(Mesh const& tp, std::vector<std::vector<std::int64_t>> const& prompts,
                      generation_options const& o) {
  auto const all = gather_values(tp.comm(0), describe_request(prompts, o));
  bool same = true;
  for (auto const& r : all) same = same && r.hash == all.front().hash;
  if (same) return;
  std::string ranks;
  for (std::size_t q = 0; q < all.size(); ++q)
    ranks += concat(q ? "; " : "", "rank ", q, " has ", all[q].prompts, " prompts of ", all[q].tokens,
                    " tokens (request hash ", all[q].hash, ")");
  fail("shardwise::generate: the ranks of mesh axis \"", tp.comm(0).label(),
       "\" were given different prompts or options: ", ranks, ". Give every rank the same prompts and options");
}

/// With the model's experts placed over ep ranks, each rank computes its experts for every rank's tokens, so the
/// ep ranks step together: refuses, on every ep rank with the same words, prompts or options that differ across
/// them. Three 16-bit parts of each request's hash, their squares and a count are summed over ep: n * sum(h^2) equals
/// sum(h)^2 only if every rank's h is the same (exact in double up to 1,024 ranks).
template <class Model>
void agree_over_placed_experts(Model& model, std::vector<std::vector<std::int64_t>> const& prompts,
                               generation_options const& o) {
  expert_parallel const* placed = experts_placement(model);
  if (!placed) return;
  std::uint64_t const hash = describe_request(prompts, o).hash;
  nn::vector<double> sums(7);
  for (int part = 0; part < 3; ++part) {
    auto const h = static_cast<double>((hash >> (16 * part)) & 0xffff);
    sums(2 * part) = h, sums(2 * part + 1) = h * h;
  }
  sums(6) = 1.0;
  placed->sum(sums);
  bool same = true;
  for (int part = 0; part < 3; ++part) same = same && sums(6) * sums(2 * part + 1) == sums(2 * part) * sums(2 * part);
  if (!same)
    fail("shardwise::generate: the ranks of mesh axis \"", placed->axis(),
         "\", over which the model's experts are placed, were given different prompts or options; every ep rank "
         "computes its experts for the tokens of all, so they generate together: give every ep rank the same prompts "
         "and options");
}

/// Checks the prompts and options against the model; returns the cache's capacity per sequence.
inline std::size_t checked_request(std::vector<std::vector<std::int64_t>> const& prompts, generation_options const& o,
                                   std::size_t vocabulary, std::size_t position_limit) {
  constexpr char const* fn = "shardwise::generate: ";
  if (prompts.empty()) fail(fn, "no prompts; give at least one prompt of token ids");
  if (o.max_new_tokens <= 0)
    fail(fn, "max_new_tokens is ", o.max_new_tokens, "; give at least 1 (the new tokens per prompt at most)");
  check_sampling({o.temperature, o.top_k, o.top_p});
  std::size_t longest = 0;
  for (std::size_t i = 0; i < prompts.size(); ++i) {
    if (prompts[i].empty()) fail(fn, "prompt ", i, " is empty; give every prompt at least one token id");
    for (std::size_t j = 0; j < prompts[i].size(); ++j)
      if (prompts[i][j] < 0 || static_cast<std::size_t>(prompts[i][j]) >= vocabulary)
        fail(fn, "token ", prompts[i][j], " at position ", j, " of prompt ", i, " is outside the vocabulary [0, ",
             vocabulary, "); give ids the model's tokenizer made");
    longest = std::max(longest, prompts[i].size());
  }
  auto const new_tokens = static_cast<std::size_t>(o.max_new_tokens);
  std::size_t const capacity = o.capacity != 0 ? o.capacity : longest + new_tokens;
  for (std::size_t i = 0; i < prompts.size(); ++i)
    if (prompts[i].size() + new_tokens > capacity)
      fail(fn, "prompt ", i, " has ", prompts[i].size(), " tokens, and with max_new_tokens ", new_tokens, " it needs ",
           prompts[i].size() + new_tokens, " positions, more than the cache's capacity of ", capacity,
           "; give a larger capacity or fewer new tokens");
  if (capacity > position_limit)
    fail(fn, "the cache needs ", capacity, " positions but the model has ", position_limit,
         " (its position embedding); give shorter prompts or fewer new tokens");
  return capacity;
}

/// The positions a model can embed: its shardwise_position_limit() where it has one (learned positions).
template <class Model>
std::size_t position_limit(Model const& model) {
  if constexpr (requires { model.shardwise_position_limit(); })
    return model.shardwise_position_limit();
  else
    return ~std::size_t{0};
}

/// The logits of a cached forward as whole rows on every rank, the vocabulary's padding left out.
template <class T, class Model, class Logits>
nn::matrix<T> whole_logits(Model& model, Logits const& logits, std::size_t vocabulary) {
  using P = typename Logits::placement;
  if constexpr (std::is_same_v<P, Replicate>) {
    return logits.local.leftCols(static_cast<Eigen::Index>(vocabulary));
  } else {
    auto const* g = group_under<T>(model);
    if (!g) fail("shardwise::generate: the model's logits are cut but it has no tp group; call sw::parallelize first");
    nn::matrix<T> const whole = redistribute_activation<P, Replicate, T>(*g, logits.local);
    return whole.leftCols(static_cast<Eigen::Index>(vocabulary));
  }
}

/// generate's default observer: sees nothing.
struct ignore_logits {
  template <class... A>
  void operator()(A&&...) const {}
};

}  // namespace detail

/// Generates up to options.max_new_tokens tokens after each prompt with `model`, parallelized over the 1-D mesh
/// `tp` (a model under sw::serial_plan: a mesh of one rank). Checks first, on every rank with the same words: the
/// ranks' prompts and options agree; no prompt is empty, has an id outside the vocabulary or overflows the cache;
/// the options are in range. `observe(step, sequences, logits)` (optional) sees each step's whole logits, one row
/// per running sequence, before the tokens are picked.
template <class Model, class Mesh, class Observer = detail::ignore_logits>
generation generate(Model& model, Mesh const& tp, std::vector<std::vector<std::int64_t>> const& prompts,
                    generation_options const& options = {}, Observer&& observe = {}) {
  using T = detail::decoder_element_t<Model>;
  static_assert(cached_decoder<Model, T>,
                "shardwise::generate: the model needs forward(ids, cache_step const&, kv_cache<T>&), "
                "shardwise_kv_shape() and config().vocabulary; see docs/inference.md for a module of your own");
  detail::agree_on_request(tp, prompts, options);
  detail::agree_over_placed_experts(model, prompts, options);
  std::size_t const vocabulary = model.config().vocabulary;
  kv_cache<T> cache(model.shardwise_kv_shape(), prompts.size(),
                    detail::checked_request(prompts, options, vocabulary, detail::position_limit(model)));
  generation out{std::vector<std::vector<std::int64_t>>(prompts.size()), 0, 0, 0, cache.bytes()};
  sampling const rule{options.temperature, options.top_k, options.top_p};
  token_draws draws(options.seed);
  std::vector<std::size_t> running(prompts.size()), counts;
  std::iota(running.begin(), running.end(), std::size_t{0});
  std::vector<std::int64_t> ids;
  for (auto const& p : prompts) ids.insert(ids.end(), p.begin(), p.end()), counts.push_back(p.size());
  auto const began = std::chrono::steady_clock::now();
  for (std::size_t step_index = 0; !running.empty(); ++step_index) {
    cache_step const step = cache.append(running, counts);
    nn::matrix<T> const logits = detail::whole_logits<T>(model, model.forward(ids, step, cache), vocabulary);
    observe(step_index, std::span<const std::size_t>(running), logits);
    std::vector<std::size_t> still;
    ids.clear();
    for (std::size_t r = 0; r < running.size(); ++r) {
      std::span<const T> row(logits.data() + r * vocabulary, vocabulary);
      std::int64_t const token = sample_token(row, rule, rule.temperature > 0 ? draws.next() : 0.0);
      auto& mine = out.tokens[running[r]];
      mine.push_back(token);
      bool const stop =
          std::find(options.stop_tokens.begin(), options.stop_tokens.end(), token) != options.stop_tokens.end();
      if (!stop && mine.size() < static_cast<std::size_t>(options.max_new_tokens))
        still.push_back(running[r]), ids.push_back(token);
    }
    double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    if (step_index == 0)
      out.first_token_seconds = seconds;
    else
      out.decode_seconds = seconds - out.first_token_seconds, out.decoded_tokens += running.size();
    running = std::move(still);
    counts.assign(running.size(), 1);
  }
  return out;
}

}  // namespace shardwise
