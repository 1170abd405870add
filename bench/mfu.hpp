#pragma once
// Model FLOPs utilisation, as the benchmarks print it: a training step's model FLOPs (6 per token per weight that
// multiplies, and causal attention's products; recomputation not counted) at the measured rate, over the fp32 FMA
// peak of the cores the ranks run on (bench/core_peak.hpp, measured in the same run).
#include <algorithm>
#include <shardwise/models/llama_config.hpp>
#include <thread>

#include "core_peak.hpp"

namespace bench {

/// The FLOPs a training step of `sequences` sequences needs: forward and backward of every weight that multiplies
/// (the embedding is a lookup; a mixture of experts counts the top_k experts each token runs, its shared expert and its
/// router) and of causal attention's two products per head (s(s+1)/2 visible pairs; the backward's four).
inline double llama_training_flops(shardwise::models::LlamaConfig const& c, int sequences) {
  double const tokens = double(sequences) * double(c.sequence), hd = double(c.head_dim());
  double const q = double(c.heads) * hd, kv = double(c.kv_heads) * hd;
  double const attention = double(c.dim) * (2 * q + 2 * kv);  // wq, wk, wv, wo
  double feed_forward = 3 * double(c.dim) * double(c.hidden);
  if (c.moe)
    feed_forward = double(c.moe->top_k) * 3 * double(c.dim) * double(c.moe->expert_hidden) +
                   double(c.dim) * double(c.moe->experts) + 3 * double(c.dim) * double(c.moe->shared_expert_hidden);
  double const weights = double(c.layers) * (attention + feed_forward) + double(c.dim) * double(c.vocabulary);
  double const pairs = double(c.sequence) * double(c.sequence + 1) / 2;
  return 6 * tokens * weights + 12 * hd * pairs * double(c.heads) * double(c.layers) * double(sequences);
}

/// MFU: `flops` done in `seconds` by `ranks` ranks (at most the machine's cores count), over their fp32 peak; 0
/// where the peak is unknown.
inline double mfu(double flops, double seconds, int ranks, double core_peak) {
  double const cores = std::min<double>(ranks, std::max(1u, std::thread::hardware_concurrency()));
  return core_peak > 0 && seconds > 0 ? flops / seconds / (cores * core_peak) : 0.0;
}

}  // namespace bench
