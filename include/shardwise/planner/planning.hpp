#pragma once
// What the planner's estimates are made of, for any model: element sizes, how optimizer state is sharded over
// dp, a machine's GEMM rate, memory bandwidth and links, a layout of the ranks and its estimate. The Llama
// planner (planner/llama.hpp) and machine files (planner/machine_file.hpp) build on it.
#include <cstddef>
#include <string>
#include <string_view>

#include "shardwise/cost/transfer.hpp"
#include "shardwise/placement/chunk.hpp"

namespace shardwise::planner {

/// Bytes per parameter element of the parameters, gradients and optimizer state, and per activation element.
struct precision {
  std::size_t parameter = 2;             ///< The parameters the forward computes with.
  std::size_t gradient = 2;              ///< Their gradients.
  std::size_t optimizer = 12;            ///< AdamW's state: moments (and the fp32 master copy under mixed precision).
  std::size_t activation = 2;            ///< Saved activations.
  std::string_view name = "bf16 mixed";  ///< As printed.
};
/// bf16 parameters, gradients and activations with fp32 master weights and moments: 2 + 2 + 12 bytes per
/// parameter, the accounting of the ZeRO paper (K = 12) and of Megatron-LM.
inline constexpr precision bf16_mixed{};
/// fp32 throughout, as shardwise's benchmarks on this CPU run: 4 + 4 + 8 (two moments).
inline constexpr precision fp32{4, 4, 8, 4, "fp32"};

/// Where the optimizer state, gradients and parameters live across the data-parallel axis.
enum class state_sharding {
  replicated,  ///< Every dp rank holds all (plain data parallelism, gradients all-reduced).
  zero1,       ///< The optimizer state sharded over dp (AdamWOptions::zero1).
  fsdp         ///< Parameters, gradients and optimizer state sharded (full shard, one unit per block).
};
/// The pipeline schedule a layout with stages runs.
enum class pipeline_choice : unsigned char {
  one_f_one_b,     ///< sw::OneFOneB
  zero_bubble_h1,  ///< sw::ZeroBubbleH1: 1F1B's order, the weight gradients put off into the bubble
  zero_bubble_v,   ///< sw::ZeroBubbleV: two chunks per rank in the V (layers a multiple of 2 pp)
};
/// "1f1b", "zbh1", "zbv".
constexpr std::string_view schedule_name(pipeline_choice s) {
  return s == pipeline_choice::one_f_one_b ? "1f1b" : s == pipeline_choice::zero_bubble_h1 ? "zbh1" : "zbv";
}

/// "replicated", "zero1", "fsdp".
constexpr std::string_view sharding_name(state_sharding s) {
  return s == state_sharding::replicated ? "replicated" : s == state_sharding::zero1 ? "zero1" : "fsdp";
}

/// One mesh axis' link: time of a transfer = latency + bytes on the wire / bandwidth.
struct link {
  double bandwidth = 50e9;  ///< Bytes per second one rank sends.
  double latency = 2e-6;    ///< Seconds per call.
};

/// What a step time is predicted from: per rank, the GEMM rate and the memory bandwidth (element-wise passes,
/// the optimizer), and a link per mesh axis. The defaults are this machine's, as `bench_machine` measures them.
struct machine {
  std::string name = "2-core AMD EPYC (Zen 3), thread mesh: measured by bench_machine";  ///< As printed.
  /// When its rates were measured (bench_machine writes the UTC time), printed by `shardwise plan` so that a
  /// stale file shows its age; empty when not known (an assumed machine, or a file without the field).
  std::string measured = "2026-11-26";
  double gemm_flops = 80e9;  ///< FLOP/s of one rank's GEMMs at large token counts (the fitted peak).
  /// Tokens per GEMM at which the rate is half the peak: rate = gemm_flops x tokens / (tokens + this). Small
  /// microbatches run the GEMM kernels below their peak (here: 64 tokens 56, 2048 tokens 78 GFLOP/s).
  double gemm_half_rate_tokens = 26;
  /// Bytes/s one rank reads and writes in element-wise passes: measured as AdamW's step (its 28 bytes per fp32
  /// parameter, its gradient-norm pass included), the largest such pass of a step.
  double memory_bandwidth = 9.4e9;
  link tp{24e9, 1.3e-6};  ///< Thread-mesh all-reduce of 1 MiB; 4 KiB for the latency.
  /// Ranks on one node, joined by the tp link; a tp group larger than this talks over the dp link. 0: all.
  std::size_t ranks_per_node = 0;
  link dp{3.2e9, 1.3e-6};  ///< Thread-mesh all-gather of 64 MiB: a memory-bound copy.
  link pp{4.6e9, 1.3e-6};  ///< Thread-mesh send and receive of 1 MiB.
};

/// The batch of one optimizer step.
struct training_shape {
  std::size_t batch = 1024;      ///< Sequences per step, over all dp ranks.
  std::size_t sequence = 4096;   ///< Tokens per sequence.
  precision bytes = bf16_mixed;  ///< Element sizes.
};

/// One layout of the ranks and its settings. dp x pp x tp x cp = the rank count.
struct layout {
  std::size_t dp = 1;            ///< Data-parallel ranks.
  std::size_t pp = 1;            ///< Pipeline stages (1F1B unless `schedule` says otherwise).
  std::size_t tp = 1;            ///< Tensor-parallel ranks (with sequence parallelism).
  std::size_t microbatches = 1;  ///< Per step and dp rank (gradient accumulation or the pipeline's).
  state_sharding sharding = state_sharding::replicated;  ///< Over dp (and cp, whose ranks hold the same parameters).
  bool checkpointing = false;                            ///< Activation checkpointing per block.
  std::size_t cp = 1;  ///< Context-parallel ranks: each sequence cut in head-tail chunks, ring attention.
  pipeline_choice schedule = pipeline_choice::one_f_one_b;  ///< With pp > 1: the pipeline schedule.
};

/// A layout's predicted memory per rank (the busiest rank: the first pipeline stage) and step time.
struct estimate {
  layout plan;                 ///< What was estimated.
  std::size_t parameters = 0;  ///< Parameter elements on the busiest rank before dp sharding.
  /// Parameters, gradients and optimizer state; under FSDP also the root unit (embedding, final norm, output)
  /// and one block gathered whole with their gradients, as fully_shard holds them at the backward's peak.
  std::size_t state_bytes = 0;
  std::size_t activation_bytes = 0;  ///< Saved activations at the peak (microbatches in flight).
  /// A backward's transients at the peak: a block's (its declared working_bytes), the two activation-sized
  /// gradients around it (the one the stage was given, the one it passes on) and, at pp 1, the loss's gradient
  /// of the logits, which the training loop holds through the backward.
  std::size_t working_bytes = 0;
  double step_seconds = 0;       ///< One optimizer step.
  double tokens_per_second = 0;  ///< The whole job's.
  /// Everything held at the peak.
  [[nodiscard]] std::size_t bytes_per_rank() const { return state_bytes + activation_bytes + working_bytes; }
};

/// Bytes of parameters, gradients and optimizer state per rank for `elements` parameter elements sharded over
/// `dp` ranks as `s` says (torch.chunk's largest piece), without FSDP's gathered unit.
constexpr std::size_t model_state_bytes(std::size_t elements, std::size_t dp, state_sharding s, precision p) {
  std::size_t const shard = chunk_size(elements, dp, 0);  // torch.chunk's largest piece
  switch (s) {
    case state_sharding::replicated:
      return elements * (p.parameter + p.gradient + p.optimizer);
    case state_sharding::zero1:
      return elements * (p.parameter + p.gradient) + shard * p.optimizer;
    default:
      return shard * (p.parameter + p.gradient + p.optimizer);
  }
}

/// Seconds one rank spends in the transfers of `list` on mesh axis `axis` (of `ranks` ranks) through `l`; a receive
/// costs nothing of its own (its bytes are the sender's wire time).
inline double transfer_seconds(transfer_list<> const& list, std::string_view axis, std::size_t ranks, link l,
                               double element_scale) {
  double const n = static_cast<double>(ranks);
  double seconds = 0;
  for (transfer const& t : list) {
    if (t.axis.view() != axis || t.kind == transfer_kind::recv) continue;
    double const bytes = static_cast<double>(t.bytes) * element_scale;
    double wire = bytes;
    if (t.kind == transfer_kind::all_reduce) wire = 2 * (n - 1) / n * bytes;
    if (t.kind == transfer_kind::all_gather) wire = (n - 1) * bytes;
    if (t.kind == transfer_kind::reduce_scatter) wire = (n - 1) / n * bytes;
    seconds += static_cast<double>(t.count) * (l.latency + wire / l.bandwidth);
  }
  return seconds;
}

}  // namespace shardwise::planner
