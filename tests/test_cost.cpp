// A plan's cost against a counting thread mesh at 1, 2 and 4 ranks (cases/cost_cases.hpp), and the cost as a
// compile-time value: static_asserts on the Llama feed-forward, attention and block (with sequence parallelism,
// and unsharded).
#include <algorithm>

#include "cases/cost_cases.hpp"

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

// A backward's transients: the feed-forward's peak is in its first statement (three tokens x hidden tensors on
// this rank and one tokens x dim) or its second (two and three); a block's is its larger branch's, not the sum
// (the branches run one after the other).
static_assert(ffn_tp2.working_bytes ==
              std::max(3 * tokens * 176 / 2 + tokens * 64, 2 * tokens * 176 / 2 + 3 * tokens * 64) * 4);
constexpr sw::cost attention_serial = sw::cost_of<Attention<sw::serial_plan>>(config, sw::cost_inputs{tokens, 1, 0});
constexpr sw::cost ffn_serial = sw::cost_of<FeedForward<sw::serial_plan>>(config, sw::cost_inputs{tokens, 1, 0});
static_assert(block_serial.working_bytes == std::max(attention_serial.working_bytes, ffn_serial.working_bytes));
static_assert(block_serial.working_bytes < attention_serial.working_bytes + ffn_serial.working_bytes);
}  // namespace

TEST_CASE("The Llama block's predicted cost equals what a counting thread mesh records, at 1, 2 and 4 ranks") {
  for (int ranks : {1, 2, 4}) sw::run_threads(ranks, [](auto& world) { cost_cases::run_cost_cases(world); });
}

TEST_CASE("sw::pipeline_step_cost puts a chunk's own transfers at each forward and backward of the schedule") {
  sw::stage_transfers<> chunk;
  chunk.forward.add(sw::transfer_kind::all_reduce, "tp", 8);
  chunk.backward.add(sw::transfer_kind::all_reduce, "tp", 16);
  // GPipe, 2 stages, 2 microbatches. Rank 0: forward, send; forward, send; then receive, backward twice.
  auto const first = sw::pipeline_step_cost(sw::GPipe{}, 2, 0, 2, 100, chunk);
  auto const expected_first = sw::transfer_list<>()
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
