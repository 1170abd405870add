// The cost of a plan, known before it runs: what one Llama block holds and sends per rank under tensor and
// sequence parallelism, as a compile-time value, checked against a memory limit by the compiler; then the
// same block run on a counting thread mesh, whose record must equal the prediction entry for entry.
#include <atomic>
#include <cstdio>
#include <iostream>
#include <shardwise/mesh/counting.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

constexpr models::LlamaConfig config{
    .vocabulary = 1024, .dim = 256, .layers = 1, .heads = 8, .kv_heads = 4, .hidden = 704, .sequence = 64};
constexpr std::size_t tokens = 4 * config.sequence;  // a microbatch of 4 sequences
constexpr int tp = 4;

using Plan = sw::plan<sw::at<"layers.*.attention_norm", sw::SequenceParallel<>>,
                      sw::at<"layers.*.attention", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
                      sw::at<"layers.*.attention.wq", sw::ColwiseParallel<>>,
                      sw::at<"layers.*.attention.wk", sw::ColwiseParallel<>>,
                      sw::at<"layers.*.attention.wv", sw::ColwiseParallel<>>,
                      sw::at<"layers.*.attention.wo", sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>,
                      sw::at<"layers.*.ffn_norm", sw::SequenceParallel<>>,
                      sw::at<"layers.*.feed_forward", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
                      sw::at<"layers.*.feed_forward.w1", sw::ColwiseParallel<>>,
                      sw::at<"layers.*.feed_forward.w3", sw::ColwiseParallel<>>,
                      sw::at<"layers.*.feed_forward.w2", sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>>;
using Block = models::LlamaBlock<float, sw::subplan<Plan, "layers.*">>;

struct OneBlock {  // the plan's paths start at "layers.*"
  std::vector<Block> layers;
  SHARDWISE_CHILDREN(layers)
};

// Rank 0's cost; every rank's is the same here (the tokens divide over tp).
constexpr sw::cost block_cost = sw::cost_of<Block>(config, sw::cost_inputs{tokens, tp, 0});
static_assert(sw::fits_in_memory<block_cost.bytes_per_rank(), 4 << 20>());    // with its activations: < 4 MiB
static_assert(block_cost.forward.calls(sw::transfer_kind::all_gather) == 2);  // the two PrepareModuleInput
static_assert(block_cost.forward.bytes(sw::transfer_kind::reduce_scatter) == 2 * tokens * config.dim * 4);

int main() {
  std::printf("one Llama block at TP %d with sequence parallelism, %zu tokens, per rank:\n", tp, tokens);
  std::printf("  parameters %zu B, gradients %zu B, activations kept for backward %zu B\n", block_cost.parameter_bytes,
              block_cost.gradient_bytes, block_cost.activation_bytes);
  for (auto const& t : block_cost.forward) std::cout << "  forward:  " << t << '\n';  // "all_gather on tp: 1 x ..."
  for (auto const& t : block_cost.backward) std::cout << "  backward: " << t << '\n';

  std::atomic<int> mismatches = 0;
  sw::run_threads(tp, [&](auto& world) {
    auto counted = sw::counting(world);  // records every transfer of the meshes built on it
    auto const mesh = sw::make_mesh<"tp">(counted, {tp});
    OneBlock model{};
    model.layers.emplace_back(config, 7);
    sw::parallelize(model, mesh);
    auto const rows = static_cast<Eigen::Index>(tokens / tp);
    sw::Activation<float, sw::Shard<0>> x{sw::nn::matrix<float>::Random(rows, config.dim)};
    auto const y = model.layers[0].forward(x);
    bool const forward_ok = counted.log().entries() == block_cost.forward;
    counted.log().clear();
    model.layers[0].backward(y);
    bool const backward_ok = counted.log().entries() == block_cost.backward;
    if (!forward_ok || !backward_ok) ++mismatches;
  });
  std::printf(mismatches > 0 ? "the record differs from the prediction\n" : "recorded on every rank: as predicted\n");
  return mismatches > 0 ? 1 : 0;
}
