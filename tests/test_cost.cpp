// A plan's cost against a counting thread mesh at 1, 2 and 4 ranks (cases/cost_cases.hpp), and the cost as a
// compile-time value: static_asserts on the Llama feed-forward, attention and block (with sequence parallelism,
// and unsharded), on transfer lists with repeat groups, and on whole Llama 3 sized models.
#include <algorithm>
#include <iterator>
#include <stdexcept>

#include "../examples/blocks.hpp"
#include "cases/cost_cases.hpp"
#include "support/worlds.hpp"

namespace {
namespace sw = shardwise;
namespace models = shardwise::models;

constexpr models::LlamaConfig config{
    .vocabulary = 256, .dim = 64, .layers = 2, .heads = 8, .kv_heads = 4, .hidden = 176};
constexpr std::size_t tokens = 4 * 32;
using tp_plan = models::llama_plan<false>;
using sp_plan = models::llama_plan<true>;
template <class Plan>
using FeedForward = models::LlamaFeedForward<float, sw::subplan<Plan, "layers.*.feed_forward">>;
template <class Plan>
using Block = models::LlamaBlock<float, sw::subplan<Plan, "layers.*">>;

constexpr sw::cost ffn_tp2 = sw::cost_of<FeedForward<tp_plan>>(config, sw::cost_inputs{tokens, 2, 0});
// TP forward of the MLP is exactly one all-reduce of tokens x dim elements; its backward sends nothing itself
// (the Partial input gradient is reduced at the block's boundary).
static_assert(ffn_tp2.forward == sw::transfer_list<>().add(sw::transfer_kind::all_reduce, "tp", tokens * 64 * 4));
static_assert(ffn_tp2.backward.empty());
// w1, w3 by rows and w2 by columns: a half of each weight.
static_assert(ffn_tp2.parameter_bytes == 3 * 64 * 176 / 2 * 4);

// The attention under TP: wo's all-reduce of tokens x dim forward; its Partial input gradient is reduced at the
// block's boundary, so its own backward sends nothing. Half of wq, wk, wv and wo on each rank.
template <class Plan>
using Attention = models::LlamaAttention<float, sw::subplan<Plan, "layers.*.attention">>;
constexpr sw::cost attention_tp2 = sw::cost_of<Attention<tp_plan>>(config, sw::cost_inputs{tokens, 2, 1});
static_assert(attention_tp2.forward == sw::transfer_list<>().add(sw::transfer_kind::all_reduce, "tp", tokens * 64 * 4));
static_assert(attention_tp2.backward.empty());
static_assert(attention_tp2.parameter_bytes == (64 * 64 + 2 * 64 * 32 + 64 * 64) / 2 * 4);
// From its own code run on shapes (this rank's 4 of 8 query heads and 2 of 4 key-value heads, 8 wide). Kept: the
// input x, which wq, wk and wv each keep; q, k and v; each query row's logsumexp per head; wo's input. The
// backward's peak: wo's input gradient and q, k and v's gradients throughout, beside them the kernel's two
// [32 query rows, 32 keys] panels, then (larger) the three input gradients, summed into the first.
static_assert(attention_tp2.activation_bytes ==
              (3 * tokens * 64 + tokens * (32 + 16 + 16) + tokens * 4 + tokens * 32) * 4);
static_assert(attention_tp2.working_bytes ==
              (tokens * 32 + tokens * (32 + 16 + 16) + std::max<std::size_t>(2 * 32 * 32, 3 * tokens * 64)) * 4);

// The block under sequence parallelism: per branch an all-gather of this rank's tokens and a reduce-scatter of
// all of them, forward; backward the same, conjugated, in reverse branch order.
constexpr sw::cost block_sp4 = sw::cost_of<Block<sp_plan>>(config, sw::cost_inputs{tokens, 4, 3});
constexpr std::size_t piece = tokens / 4 * 64 * 4, whole = tokens * 64 * 4;
static_assert(block_sp4.forward == sw::transfer_list<>()
                                       .add(sw::transfer_kind::all_gather, "tp", piece)
                                       .add(sw::transfer_kind::reduce_scatter, "tp", whole)
                                       .add(sw::transfer_kind::all_gather, "tp", piece)
                                       .add(sw::transfer_kind::reduce_scatter, "tp", whole));
static_assert(block_sp4.backward == block_sp4.forward);
static_assert(block_sp4.forward.calls(sw::transfer_kind::all_reduce) == 0);

// Unsharded: nothing moves, and the rank holds the whole block.
constexpr sw::cost block_serial = sw::cost_of<models::LlamaBlock<float>>(config, sw::cost_inputs{tokens, 1, 0});
static_assert(block_serial.forward.empty() && block_serial.backward.empty());
static_assert(block_serial.parameter_bytes == (2 * 64 + 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 176) * 4);

// A backward's transients: the feed-forward's peak is in its first statement (two tokens x hidden tensors on
// this rank and one tokens x dim: the SiLU's gradient is written into its operand) or its second (one and two:
// products and sums go into temporaries). A block's branches run one after the other, the feed-forward's first:
// its peak is that branch's, or the attention's beside the feed-forward branch's input gradient (tokens x dim),
// which the attention's branch adds its own to; not the sum.
static_assert(ffn_tp2.working_bytes ==
              std::max(2 * tokens * 176 / 2 + tokens * 64, tokens * 176 / 2 + 2 * tokens * 64) * 4);
constexpr sw::cost attention_serial = sw::cost_of<Attention<sw::serial_plan>>(config, sw::cost_inputs{tokens, 1, 0});
constexpr sw::cost ffn_serial = sw::cost_of<FeedForward<sw::serial_plan>>(config, sw::cost_inputs{tokens, 1, 0});
static_assert(block_serial.working_bytes ==
              std::max(ffn_serial.working_bytes, tokens * 64 * 4 + attention_serial.working_bytes));
static_assert(block_serial.working_bytes < attention_serial.working_bytes + ffn_serial.working_bytes);

// A body appended n times is stored once with a repeat group, and shows exactly what n plain appends show:
// the same flat entries, identical calls in a row merged, across the group's edges and its repetitions.
constexpr auto ag = sw::transfer_kind::all_gather, rs = sw::transfer_kind::reduce_scatter,
               ar = sw::transfer_kind::all_reduce;
static_assert(std::forward_iterator<sw::transfer_list<>::iterator>);
constexpr auto alternating = sw::transfer_list<>().add(ag, "tp", 1).add(rs, "tp", 4).add(ar, "dp", 8);
constexpr auto wrapping =
    sw::transfer_list<>().add(ag, "tp", 1).add(rs, "tp", 4).add(ag, "tp", 1, 2);  // ends as it starts
template <std::size_t N>
constexpr auto around_plain(sw::transfer_list<N> const& body, std::size_t n) {
  sw::transfer_list<> list;
  list.add(ar, "tp", 2);
  for (std::size_t i = 0; i < n; ++i) list.append(body);
  return list.add(ag, "tp", 1);  // wrapping's last call: merges with the last repetition's
}
template <std::size_t N>
constexpr auto around_grouped(sw::transfer_list<N> const& body, std::size_t n) {
  return sw::transfer_list<>().add(ar, "tp", 2).append(body, n).add(ag, "tp", 1);
}
template <std::size_t M, std::size_t N>
constexpr bool shows_the_same(sw::transfer_list<M> const& a, sw::transfer_list<N> const& b) {
  bool same = a == b && a.size() == b.size() && a.calls() == b.calls();
  for (auto kind : {ag, rs, ar})
    same = same && a.calls(kind, "tp") == b.calls(kind, "tp") && a.bytes(kind) == b.bytes(kind);
  for (std::size_t i = 0; i < a.size(); ++i) same = same && a[i] == b[i];
  return same && std::equal(a.begin(), a.end(), b.begin(), b.end());
}
static_assert(shows_the_same(around_grouped(alternating, 5), around_plain(alternating, 5)));
static_assert(around_grouped(alternating, 5).size() == 1 + 3 * 5 + 1 && around_grouped(alternating, 5).stored() == 5);
static_assert(shows_the_same(around_grouped(wrapping, 3), around_plain(wrapping, 3)));
// Written out: the body's last all-gathers merge with the next repetition's first, the last with the list's.
static_assert(around_grouped(wrapping, 3) == sw::transfer_list<>()
                                                 .add(ar, "tp", 2)
                                                 .add(ag, "tp", 1)
                                                 .add(rs, "tp", 4)
                                                 .add(ag, "tp", 1, 3)
                                                 .add(rs, "tp", 4)
                                                 .add(ag, "tp", 1, 3)
                                                 .add(rs, "tp", 4)
                                                 .add(ag, "tp", 1, 3));
static_assert(around_grouped(wrapping, 3)[7] == sw::transfer{ag, "tp", 1, 3} &&
              around_grouped(wrapping, 3).size() == 8);
static_assert(around_grouped(wrapping, 3).calls(ag) == 1 + 3 * 3 && around_grouped(wrapping, 3).bytes(rs) == 3 * 4);
// A list with a group of its own, appended 4 times: repeated whole, its group kept in each copy.
constexpr auto nested = sw::transfer_list<>().add(rs, "tp", 4).append(around_grouped(wrapping, 3), 4);
static_assert(shows_the_same(nested, [] {
  sw::transfer_list<> list;
  list.add(rs, "tp", 4);
  for (int i = 0; i < 4; ++i) list.append(around_plain(wrapping, 3));
  return list;
}()));
// A body of one entry is a count; a list appended to itself.
static_assert(sw::transfer_list<>().append(sw::transfer_list<>().add(ar, "tp", 2, 3), 4).stored() == 1);
static_assert(shows_the_same(
    [] {
      auto list = around_grouped(wrapping, 3);
      return list.append(list, 2);
    }(),
    [] {
      sw::transfer_list<> list;
      for (int i = 0; i < 3; ++i) list.append(around_plain(wrapping, 3));
      return list;
    }()));

// fold_repeat: calls that append what the call before appended are stored once, as a repeat group; the flat
// sequence is what appending them in full gives. `calls` of `body` after a lead-in, each folded as it ends.
template <std::size_t N>
constexpr auto folded(sw::transfer_list<N> const& body, std::size_t calls) {
  sw::transfer_list<> list;
  list.add(ar, "dp", 8);
  for (std::size_t i = 0; i < calls; ++i) {
    std::size_t const from = list.stored();
    list.append(body).fold_repeat(from);
  }
  return list;
}
template <std::size_t N>
constexpr auto unfolded(sw::transfer_list<N> const& body, std::size_t calls) {
  sw::transfer_list<> list;
  list.add(ar, "dp", 8);
  for (std::size_t i = 0; i < calls; ++i) list.append(body);
  return list;
}
constexpr auto two_moves = sw::transfer_list<>().add(ag, "tp", 1).add(rs, "tp", 4);
static_assert(folded(two_moves, 5).stored() == 3 && shows_the_same(folded(two_moves, 5), unfolded(two_moves, 5)));
// A body that starts as the list ends merges into it the first time: the second and third calls fold (stored: the
// merged entry and rs, then ar and rs once).
constexpr auto starts_like_lead = sw::transfer_list<>().add(ar, "dp", 8).add(rs, "tp", 4);
static_assert(folded(starts_like_lead, 3).stored() == 4 &&
              shows_the_same(folded(starts_like_lead, 3), unfolded(starts_like_lead, 3)));
// A body with a repeat group of its own is stored in full each time.
static_assert(folded(around_grouped(wrapping, 3), 2).stored() == 1 + 2 * around_grouped(wrapping, 3).stored() &&
              shows_the_same(folded(around_grouped(wrapping, 3), 2), unfolded(around_grouped(wrapping, 3), 2)));

// Llama 3 8B (32 layers), 70B (80) and 405B (126) under sequence parallelism, as constant expressions. Per block two
// all-gathers forward (block_sp4) and two backward; the output projection gathers the stream once forward, the
// embedding gathers its gradient once backward; checkpointing runs each block's forward again in the backward.
constexpr models::LlamaConfig llama3_8b{
    .vocabulary = 128256, .dim = 4096, .layers = 32, .heads = 32, .kv_heads = 8, .hidden = 14336, .sequence = 8192};
constexpr models::LlamaConfig llama3_405b{
    .vocabulary = 128256, .dim = 16384, .layers = 126, .heads = 128, .kv_heads = 8, .hidden = 53248, .sequence = 8192};
constexpr models::LlamaConfig llama3_70b{
    .vocabulary = 128256, .dim = 8192, .layers = 80, .heads = 64, .kv_heads = 8, .hidden = 28672, .sequence = 8192};
using SpLlama = models::Llama<float, sp_plan>;
constexpr sw::cost llama_8b = sw::cost_of<SpLlama>(llama3_8b, sw::cost_inputs{8192, 4, 1});
static_assert(llama_8b.forward.calls(ag) == 2 * 32 + 1 && llama_8b.backward.calls(ag) == 2 * 32 + 1);
static_assert(llama_8b.forward.bytes(ag) == (2 * 32 + 1) * std::size_t{8192} / 4 * 4096 * 4);
// Stored: the embedding's, one all-gather and reduce-scatter repeated 64 times (a block's attention and
// feed-forward move the same), the output's.
static_assert(llama_8b.forward.size() == 1 + 4 * 32 + 1 && llama_8b.forward.stored() == 4);
constexpr sw::cost llama_8b_kept = sw::cost_of<SpLlama>(llama3_8b, sw::cost_inputs{8192, 4, 1}, true);
static_assert(llama_8b_kept.forward == llama_8b.forward && llama_8b_kept.backward.calls(ag) == 4 * 32 + 1);
// The backward stores as few, checkpointed or not: each block's recomputation and backward fold alike.
static_assert(llama_8b.backward.stored() == 4 && llama_8b_kept.backward.stored() == 4);
constexpr sw::cost llama_70b = sw::cost_of<SpLlama>(llama3_70b, sw::cost_inputs{8192, 2, 0});
static_assert(llama_70b.forward.calls(ag) == 2 * 80 + 1 && llama_70b.backward.calls(ag) == 2 * 80 + 1);
constexpr sw::cost llama_70b_kept = sw::cost_of<SpLlama>(llama3_70b, sw::cost_inputs{8192, 2, 0}, true);
static_assert(llama_70b_kept.backward.calls(ag) == 4 * 80 + 1 && llama_70b_kept.backward.size() == 1 + 8 * 80 + 1);
static_assert(sw::cost_of<SpLlama>(llama3_405b, sw::cost_inputs{8192, 8, 7}, true).backward.calls(ag) == 4 * 126 + 1);
// A whole step of 8B, checkpointed, at llama_step_cost's default capacity: the forward's and the backward's.
static_assert(models::llama_step_cost<float, sp_plan>(llama3_8b, {.tp = {8192, 4, 1}}, true).calls(ag) ==
              (2 * 32 + 1) + (4 * 32 + 1));
}  // namespace

TEST_CASE("A transfer list stores repeats once, and one that outgrows its capacity throws") {
  sw::transfer_list<4> list;
  list.add(ag, "tp", 1).add(rs, "tp", 4).add(ag, "tp", 1).add(rs, "tp", 4);
  CHECK_THROWS_WITH_AS(list.add(ar, "tp", 2), doctest::Contains("shardwise::transfer_list: more stored entries"),
                       std::length_error);
  sw::transfer_list<4> repeated;
  repeated.append(alternating, 1000);  // three entries stored, 3000 shown
  CHECK(repeated.size() == 3000);
  CHECK_THROWS_AS(repeated.append(wrapping), std::length_error);
  // llama_step_cost stores each microbatch's passes: at its default capacity twenty overflow, a larger one fits.
  models::training_step_inputs step{.tp = {tokens, 4, 0}, .microbatches = 20};
  CHECK_THROWS_WITH_AS((models::llama_step_cost<float, sp_plan>(config, step)),
                       doctest::Contains("pass a larger Capacity"), std::length_error);
  CHECK(models::llama_step_cost<float, sp_plan, 256>(config, step).calls(ag) == 20 * 2 * (2 * 2 + 1));  // 2 layers
}

TEST_CASE("A model cut over many cp ranks: its blocks' ring transfers are recorded before they fold") {
  // At cp 8 a block's backward stores 32 entries: two blocks outgrow a sw::cost's 48 before they fold, so the run
  // records into larger lists. The model sends and receives what its blocks do, and nothing else.
  models::LlamaConfig c = config;
  c.layers = 4;
  sw::cost_inputs s{4 * 32 / 8, 4, 1};  // 4 sequences of 32 tokens, this rank's 4 of each
  s.cp = {8, 3, 32, true, sw::context_method::ring};
  sw::cost const block = Block<sp_plan>::shardwise_cost(c, s);
  CHECK(block.backward.stored() > 48 / 2);  // two of them outgrow a sw::cost's list
  sw::cost const model = models::Llama<float, sp_plan>::shardwise_cost(c, s);
  for (auto kind : {sw::transfer_kind::send, sw::transfer_kind::recv}) {
    CHECK(block.backward.calls(kind, "cp") > 0);
    CHECK(model.forward.calls(kind, "cp") == 4 * block.forward.calls(kind, "cp"));
    CHECK(model.backward.calls(kind, "cp") == 4 * block.backward.calls(kind, "cp"));
    CHECK(model.backward.bytes(kind, "cp") == 4 * block.backward.bytes(kind, "cp"));
  }
}

TEST_CASE("A module's cost comes from its own code: a user's feed-forward with no cost of its own") {
  // examples/blocks.hpp's FeedForward computes what the Llama one does, but declares no cost, and its backward is
  // one statement: both branches' temporaries live to its end, so it holds more at once than Llama's two.
  using mlp_plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w3", sw::ColwiseParallel<>>,
                            sw::at<"w2", sw::RowwiseParallel<>>>;
  for (std::size_t rank : {0, 1}) {
    sw::cost_inputs const s{tokens, 2, rank};
    using user_ffn = blocks::FeedForward<sw::meta<float>, mlp_plan>;
    sw::cost const user = sw::derived_cost<user_ffn, sw::Activation<sw::meta<float>>>(s, 64, 64, 176, 7);
    sw::cost const llama = sw::cost_of<FeedForward<tp_plan>>(config, s);
    CHECK(user.forward == llama.forward);
    CHECK(user.backward == llama.backward);
    CHECK(user.parameter_bytes == llama.parameter_bytes);
    CHECK(user.activation_bytes == llama.activation_bytes);
    std::size_t const hidden = tokens * 176 / 2 * 4, dim = tokens * 64 * 4;  // one tensor of each, on this rank
    CHECK(user.working_bytes == 3 * hidden + 2 * dim);
    CHECK(llama.working_bytes == std::max(2 * hidden + dim, hidden + 2 * dim));
  }
}

// A residual branch of the Llama block, norm and feed-forward, called through sw::residual: its cost on shapes
// takes in the norm's and the plan entry's moves around the feed-forward (sequence parallelism's gather before
// it and the reduction of its Partial input gradient after it), as the hand-composed sw::call_cost states them.
template <class T, class Plan>
struct FeedForwardBranch {
  sw::RMSNorm<T, sw::layer_at<Plan, "ffn_norm">> ffn_norm;
  models::LlamaFeedForward<T, sw::subplan<Plan, "feed_forward">> feed_forward;
  SHARDWISE_CHILDREN(ffn_norm, feed_forward)
  SHARDWISE_SAVED()
  constexpr explicit FeedForwardBranch(models::LlamaConfig const& c) : ffn_norm(c.dim), feed_forward(c, 0) {}
  template <class X>
  constexpr auto forward(X const& x) {
    return sw::residual(ffn_norm, feed_forward, x);
  }
  template <class DY>
  constexpr auto backward(DY const& dy) {
    return sw::residual_backward(ffn_norm, feed_forward, dy);
  }
};

template <class Plan>
constexpr bool branch_cost_as_composed(sw::cost_inputs const& s) {
  using Branch = FeedForwardBranch<float, sw::subplan<Plan, "layers.*">>;
  using Norm = decltype(Branch::ffn_norm);
  using Inner = decltype(Branch::feed_forward);
  using input = sw::Activation<sw::meta<float>, typename Norm::layout>;
  sw::cost const derived =
      sw::derived_cost<FeedForwardBranch<sw::meta<float>, sw::subplan<Plan, "layers.*">>, input>(s, 64, config);
  sw::cost const inner = sw::call_cost<Inner, float>(Inner::shardwise_cost(config, s), 64, 64, s);
  sw::cost composed;
  composed.hold(Norm::shardwise_cost(64, s)).hold(inner);
  return derived.forward == inner.forward && derived.backward == inner.backward &&
         derived.parameter_bytes == composed.parameter_bytes && derived.gradient_bytes == composed.gradient_bytes &&
         derived.activation_bytes == composed.activation_bytes && derived.working_bytes == composed.working_bytes;
}
static_assert(branch_cost_as_composed<sp_plan>(sw::cost_inputs{tokens, 4, 3}));
static_assert(branch_cost_as_composed<sp_plan>(sw::cost_inputs{6, 4, 3}));  // uneven: rank 3 holds no token
static_assert(branch_cost_as_composed<tp_plan>(sw::cost_inputs{tokens, 2, 1}));
static_assert(branch_cost_as_composed<sw::serial_plan>(sw::cost_inputs{tokens, 1, 0}));

TEST_CASE("The Llama block's predicted cost equals what a counting thread mesh records, at 1, 2 and 4 ranks") {
  for (int ranks : {1, 2, 4}) worlds::run_threads(ranks, [](auto& world) { cost_cases::run_cost_cases(world); });
}

TEST_CASE("sw::pipeline_step_cost puts a chunk's own transfers at each forward and backward of the schedule") {
  sw::stage_transfers<> chunk;
  chunk.forward.add(sw::transfer_kind::all_reduce, "tp", 8);
  chunk.backward.add(sw::transfer_kind::all_reduce, "tp", 16);
  // GPipe, 2 stages, 2 microbatches. Every rank first agrees on the step: a gather of 72 bytes (the schedule's
  // name in 64, the microbatches and the chunks in 4 each). Rank 0: forward, send; forward, send; then receive,
  // backward twice.
  auto const first = sw::pipeline_step_cost(sw::GPipe{}, 2, 0, 2, 100, chunk);
  auto const expected_first = sw::transfer_list<>()
                                  .add(sw::transfer_kind::gather_values, "pp", 72)
                                  .add(sw::transfer_kind::all_reduce, "tp", 8)
                                  .add(sw::transfer_kind::send, "pp", 100)
                                  .add(sw::transfer_kind::all_reduce, "tp", 8)
                                  .add(sw::transfer_kind::send, "pp", 100)
                                  .add(sw::transfer_kind::recv, "pp", 100)
                                  .add(sw::transfer_kind::all_reduce, "tp", 16)
                                  .add(sw::transfer_kind::recv, "pp", 100)
                                  .add(sw::transfer_kind::all_reduce, "tp", 16);
  CHECK(first == expected_first);
  // Rank 1 (the last stage): receive, forward, twice; then backward, send, twice.
  auto const last = sw::pipeline_step_cost(sw::GPipe{}, 2, 1, 2, 100, chunk);
  auto const expected_last = sw::transfer_list<>()
                                 .add(sw::transfer_kind::gather_values, "pp", 72)
                                 .add(sw::transfer_kind::recv, "pp", 100)
                                 .add(sw::transfer_kind::all_reduce, "tp", 8)
                                 .add(sw::transfer_kind::recv, "pp", 100)
                                 .add(sw::transfer_kind::all_reduce, "tp", 8)
                                 .add(sw::transfer_kind::all_reduce, "tp", 16)
                                 .add(sw::transfer_kind::send, "pp", 100)
                                 .add(sw::transfer_kind::all_reduce, "tp", 16)
                                 .add(sw::transfer_kind::send, "pp", 100);
  CHECK(last == expected_last);
}
