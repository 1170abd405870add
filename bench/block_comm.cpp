// What one Llama block's backward sends, and how long it takes, at TP 2 on the thread mesh: with and without
// sequence parallelism, at the tests' size and at a realistic one (dim 1024). Counts come from a counting mesh
// (sw::counting, summed by sw::count_of: calls and bytes of each call's input, per rank); times are medians of
// --repeats runs.
//
//   bench_block_comm [--repeats 5] [--smoke]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <shardwise/mesh/counting.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <vector>

extern "C" void openblas_set_num_threads(int);  // the bench links OpenBLAS through shardwise::eigen_blas

namespace sw = shardwise;
namespace models = shardwise::models;
using Clock = std::chrono::steady_clock;

template <bool SequenceParallel>
using block_plan = sw::plan<
    sw::at<"layers.*.attention_norm", std::conditional_t<SequenceParallel, sw::SequenceParallel<>, sw::NoParallel>>,
    sw::at<"layers.*.attention",
           sw::PrepareModuleInput<std::conditional_t<SequenceParallel, sw::Shard<0>, sw::Replicate>, sw::Replicate>>,
    sw::at<"layers.*.attention.wq", sw::ColwiseParallel<>>, sw::at<"layers.*.attention.wk", sw::ColwiseParallel<>>,
    sw::at<"layers.*.attention.wv", sw::ColwiseParallel<>>,
    sw::at<"layers.*.attention.wo",
           sw::RowwiseParallel<sw::Shard<-1>, std::conditional_t<SequenceParallel, sw::Shard<0>, sw::Replicate>>>,
    sw::at<"layers.*.ffn_norm", std::conditional_t<SequenceParallel, sw::SequenceParallel<>, sw::NoParallel>>,
    sw::at<"layers.*.feed_forward",
           sw::PrepareModuleInput<std::conditional_t<SequenceParallel, sw::Shard<0>, sw::Replicate>, sw::Replicate>>,
    sw::at<"layers.*.feed_forward.w1", sw::ColwiseParallel<>>,
    sw::at<"layers.*.feed_forward.w3", sw::ColwiseParallel<>>,
    sw::at<"layers.*.feed_forward.w2",
           sw::RowwiseParallel<sw::Shard<-1>, std::conditional_t<SequenceParallel, sw::Shard<0>, sw::Replicate>>>>;

/// One Llama block as a model of its own.
template <class Plan>
struct OneBlock {
  std::vector<models::LlamaBlock<float, sw::subplan<Plan, "layers.*">>> layers;
  SHARDWISE_CHILDREN(layers)
  explicit OneBlock(models::LlamaConfig const& c) { layers.emplace_back(c, 7); }
};

template <bool SequenceParallel>
void measure(char const* size_name, models::LlamaConfig const& c, std::size_t tokens, int repeats) {
  std::vector<double> times;
  sw::collective_count counted;
  sw::run_threads(2, [&](auto& world) {
    openblas_set_num_threads(1);
    auto counted_world = sw::counting(world);
    auto const tp = sw::make_mesh<"tp">(counted_world, {2});
    OneBlock<block_plan<SequenceParallel>> model(c);
    sw::parallelize(model, tp);
    auto& block = model.layers[0];
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    auto const rows = static_cast<Eigen::Index>(SequenceParallel ? tokens / 2 : tokens);
    sw::nn::matrix<float> x(rows, static_cast<Eigen::Index>(c.dim)), dy(rows, static_cast<Eigen::Index>(c.dim));
    for (Eigen::Index i = 0; i < x.size(); ++i) x.data()[i] = normal(rng), dy.data()[i] = normal(rng);
    using Stream = std::conditional_t<SequenceParallel, sw::Shard<0>, sw::Replicate>;
    for (int r = 0; r < repeats + 1; ++r) {
      (void)block.forward(sw::Activation<float, Stream>{x});
      counted_world.log().clear();
      auto const start = Clock::now();
      auto const dx = block.backward(sw::Activation<float, Stream>{dy});
      double const seconds = std::chrono::duration<double>(Clock::now() - start).count();
      if (world.rank() == 0 && r > 0)  // r 0: warm-up
        times.push_back(seconds), counted = sw::count_of(counted_world.log().entries());
      (void)dx;
    }
  });
  std::sort(times.begin(), times.end());
  std::printf(
      "%-9s %-5s backward: %zu all-reduce (%8.1f KiB), %zu all-gather (%8.1f KiB), %zu reduce-scatter "
      "(%8.1f KiB); %8.1f KiB in all; %8.3f ms\n",
      size_name, SequenceParallel ? "TP2+SP" : "TP2", counted.all_reduce, counted.all_reduce_bytes / 1024.0,
      counted.all_gather, counted.all_gather_bytes / 1024.0, counted.reduce_scatter,
      counted.reduce_scatter_bytes / 1024.0, counted.bytes() / 1024.0, 1e3 * times[times.size() / 2]);
}

int main(int argc, char** argv) {
  int repeats = 5;
  bool smoke = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::atoi(argv[++i]);
    if (!std::strcmp(argv[i], "--smoke")) smoke = true, repeats = 1;
  }
  models::LlamaConfig small;
  small.dim = 32, small.heads = 4, small.kv_heads = 4, small.hidden = 64, small.sequence = 8;
  measure<false>("small", small, 16, repeats);
  measure<true>("small", small, 16, repeats);
  if (smoke) return 0;
  models::LlamaConfig large;
  large.dim = 1024, large.heads = 16, large.kv_heads = 8, large.hidden = 2816, large.sequence = 256;
  measure<false>("dim 1024", large, 1024, repeats);
  measure<true>("dim 1024", large, 1024, repeats);
  return 0;
}
