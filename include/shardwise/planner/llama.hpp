#pragma once
// The planner behind `shardwise plan`: for a model, a rank count and a memory limit, every layout of
// dp x pp x tp x microbatches x optimizer-state sharding x activation checkpointing, with its memory per rank and
// a step time predicted from a machine description, ranked. One transformer block's parameters, saved
// activations and tensor-parallel transfers come from the block's own declared cost (LlamaBlock::shardwise_cost,
// the one the counting mesh proves on real runs); the rest is the arithmetic of the schedules shardwise runs.
// The search works on a model_description; this header describes the Llama family (Llama, and Qwen2's q/k/v
// biases and Mistral's sliding window on the same block), planner/gpt2.hpp GPT-2.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/cost/cost.hpp"
#include "shardwise/models/llama.hpp"
#include "shardwise/models/llama_plan.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/planner/planning.hpp"
#include "shardwise/planner/schedule.hpp"

namespace shardwise::planner {

/// The model the planner reads its block costs from: Llama under llama_plan (sequence parallel).
using planned_model = models::Llama<float, models::llama_plan<true>>;

/// One block's and the model ends' figures on one tp rank for a microbatch of `tokens` tokens, from their
/// declared costs (fp32 elements, as planned_model computes).
struct model_figures {
  cost block;              ///< One transformer block, called through sw::forward.
  cost embedding;          ///< The token embedding (first stage).
  cost ends;               ///< Embedding, final norm and output projection (layers = 0).
  cost output;             ///< The output projection alone (its GEMM runs tied or not).
  std::size_t layers = 0;  ///< Blocks in the model.
};

/// What the search needs of a model: its sizes, and the figures of its block and ends from their declared costs.
struct model_description {
  std::string family = "Llama";  ///< As printed ("Llama", "Qwen2", "Mistral", "GPT-2").
  /// The model's sizes.
  /// @{
  std::size_t vocabulary = 0, dim = 0, layers = 0, heads = 0, kv_heads = 0, hidden = 0;
  /// @}
  std::size_t sliding_window = 0;     ///< Keys a query attends at most (Mistral); 0: the causal whole.
  bool qkv_bias = false;              ///< q, k and v projections with biases (Qwen2).
  std::size_t tensors_per_layer = 9;  ///< Parameter tensors per block (the optimizer's per-tensor latency).
  bool pipeline = true;               ///< shardwise runs the model in pipeline stages.
  /// One block's and the ends' figures for microbatches of `tokens` tokens (this cp rank's) of `sequence`-token
  /// sequences over tp ranks (this rank: 0, the largest piece), the sequences cut over `cp`.
  std::function<model_figures(std::size_t sequence, std::size_t tokens, std::size_t tp, context_inputs const& cp)>
      figures;
  bool context_parallel = false;    ///< shardwise cuts its sequences over cp (sw::context_parallelize).
  std::size_t attention_width = 0;  ///< heads * head width, where it is not dim (Qwen3's head_dim); 0: dim.
};

/// The most cp ranks the planner estimates: the ring's per-step transfers are listed in the block's declared cost,
/// whose list holds them up to 8 ranks.
inline constexpr std::size_t most_context_ranks = 8;

/// The figures of config `c` at `tokens` tokens per microbatch over tp ranks (this rank: 0, the largest piece),
/// the sequences cut over `cp` (tokens: this cp rank's).
inline model_figures figures(models::LlamaConfig const& c, std::size_t tokens, std::size_t tp,
                             context_inputs const& cp = {}) {
  using Block = planned_model::block_type;
  using Embed = decltype(std::declval<planned_model&>().tok_embeddings);
  using Output = decltype(std::declval<planned_model&>().output);
  cost_inputs const s{tokens, tp, 0, "tp", cp};
  models::LlamaConfig ends_only = c;
  ends_only.layers = 0;
  return {call_cost<Block, float>(Block::shardwise_cost(c, s), c.dim, c.dim, s),
          Embed::shardwise_cost(c.vocabulary, c.dim, s), planned_model::shardwise_cost(ends_only, s),
          Output::shardwise_cost(c.dim, c.vocabulary, s), c.layers};
}

/// The Llama family's description of config `c`: Llama's block, with Qwen2's q, k and v biases (`qkv_bias`) or
/// Mistral's sliding window (`sliding_window` keys per query; 0: none) when given; `family` names it.
inline model_description describe(models::LlamaConfig const& c, std::string family = "Llama", bool qkv_bias = false,
                                  std::size_t sliding_window = 0) {
  model_description d{std::move(family), c.vocabulary,        c.dim,    c.layers,
                      c.heads,           c.kv_heads,          c.hidden, sliding_window,
                      qkv_bias,          qkv_bias ? 12u : 9u, true,     {}};
  d.context_parallel = true;
  d.attention_width = c.heads * c.head_dim();
  d.figures = [c, qkv_bias](std::size_t sequence, std::size_t tokens, std::size_t tp, context_inputs const& cp) {
    models::LlamaConfig at = c;
    at.sequence = sequence;  // the attention's panels follow the sequence
    model_figures f = figures(at, tokens, tp, cp);
    if (qkv_bias) {  // cut as the projections' outputs: q's heads, k's and v's heads split or repeated
      std::size_t const head = c.head_dim(), kv = tp <= c.kv_heads ? c.kv_heads / tp : 1;
      f.block.parameter_bytes += (c.heads * head / tp + 2 * kv * head) * sizeof(float);
    }
    return f;
  };
  return d;
}

/// Whether shardwise can cut a model of `d`'s heads over tp ranks (whole query heads per rank, key-value heads
/// split or repeated evenly).
inline bool tp_fits(model_description const& d, std::size_t tp) {
  if (d.heads % tp != 0) return false;
  return tp <= d.kv_heads ? d.kv_heads % tp == 0 : tp % d.kv_heads == 0;
}
/// As above, for a Llama config.
inline bool tp_fits(models::LlamaConfig const& c, std::size_t tp) { return tp_fits(describe(c), tp); }

namespace detail {

/// What one pipeline stage keeps for one microbatch's backward, in fp32 bytes (with checkpointing, each block's
/// input; the recomputed block's own set is counted once per stage, by the caller).
inline std::size_t stage_activations(model_figures const& f, model_description const& d, layout const& l,
                                     std::size_t tokens, bool first, bool last) {
  std::size_t const blocks = chunk_size(f.layers, l.pp, 0);
  std::size_t const block_input = chunk_size(tokens, l.tp, 0) * d.dim * sizeof(float);  // the stream, cut by SP
  std::size_t bytes = blocks * (l.checkpointing ? block_input : f.block.activation_bytes);
  if (first) bytes += f.embedding.activation_bytes;
  if (last) bytes += f.ends.activation_bytes - f.embedding.activation_bytes;
  return bytes;
}

/// Parameter elements of one pipeline stage on one tp rank.
inline std::size_t stage_parameters(model_figures const& f, layout const& l, bool first, bool last) {
  std::size_t elements = chunk_size(f.layers, l.pp, 0) * f.block.parameter_bytes;
  if (first) elements += f.embedding.parameter_bytes;
  if (last) elements += f.ends.parameter_bytes - f.embedding.parameter_bytes;
  return elements / sizeof(float);
}

/// Seconds of one microbatch's forward and backward on the busiest stage: GEMMs at the machine's rate for the
/// microbatch's tokens (2 FLOPs per weight and token, the backward twice the forward, checkpointing one forward
/// more; the blocked attention's products over the keys each query meets, five in the backward); memory traffic (the
/// stage's weights streamed by each pass and once more for their gradients, the saved activations written, read, and
/// their gradients written and read); and the tensor-parallel transfers the block and the ends declare. For the last
/// stage (the only one at pp 1).
/// The keys a query meets on average in the blocked causal attention over `sequence` tokens, with a sliding
/// window of `window` keys (0: none): each panel of query rows reads the keys from its first row's window start.
inline double attention_keys_met(std::size_t sequence, std::size_t window) {
  if (window == 0 || window >= sequence) return nn::attention_keys_per_query(sequence);
  double pairs = 0;
  for (std::size_t first = 0; first < sequence; first += nn::attention_block_rows) {
    std::size_t const rows = std::min(nn::attention_block_rows, sequence - first);
    std::size_t const from = first + 1 > window ? first + 1 - window : 0;
    pairs += static_cast<double>(rows) * static_cast<double>(first + rows - from);
  }
  return pairs / static_cast<double>(sequence);
}

inline double microbatch_seconds(model_figures const& f, model_description const& d, layout const& l,
                                 training_shape const& t, std::size_t tokens, machine const& m) {
  std::size_t const blocks = chunk_size(f.layers, l.pp, 0);
  double const weights =
      static_cast<double>(blocks * f.block.parameter_bytes + f.output.parameter_bytes) / sizeof(float);
  // The blocked attention's two forward products per query and key it meets; its backward has five.
  double const attention = 4.0 * static_cast<double>(blocks) * static_cast<double>(tokens) *
                           attention_keys_met(t.sequence, d.sliding_window) *
                           static_cast<double>((d.attention_width != 0 ? d.attention_width : d.dim) / l.tp);
  double const passes = l.checkpointing ? 4.0 : 3.0;
  double const flops = passes * 2.0 * static_cast<double>(tokens) * weights + (passes + 0.5) * attention;
  double const scale = static_cast<double>(t.bytes.activation) / sizeof(float);
  double const saved = static_cast<double>(stage_activations(f, d, l, tokens, l.pp == 1, true)) * scale;
  double const traffic = weights * static_cast<double>((passes + 1) * t.bytes.parameter) + 4 * saved;
  link const tp = m.ranks_per_node == 0 || l.tp <= m.ranks_per_node ? m.tp : m.dp;
  link const cp = m.ranks_per_node == 0 || l.tp * l.cp <= m.ranks_per_node ? m.tp : m.dp;  // the ring's neighbours
  auto const block_seconds = [&](transfer_list<> const& list) {
    return transfer_seconds(list, "tp", l.tp, tp, scale) + transfer_seconds(list, "cp", l.cp, cp, scale);
  };
  double comm = block_seconds(f.block.forward) * (l.checkpointing ? 2.0 : 1.0) + block_seconds(f.block.backward);
  comm = comm * static_cast<double>(blocks) + transfer_seconds(f.ends.forward, "tp", l.tp, tp, scale) +
         transfer_seconds(f.ends.backward, "tp", l.tp, tp, scale);
  double const rate =
      m.gemm_flops * static_cast<double>(tokens) / (static_cast<double>(tokens) + m.gemm_half_rate_tokens);
  return flops / rate + traffic / m.memory_bandwidth + comm;
}

/// A microbatch's time on one stage (microbatch_seconds) cut as a zero-bubble schedule cuts it: F one of its passes,
/// W the Linears' weight-gradient products, B the rest.
inline microbatch_parts microbatch_split(model_figures const& f, layout const& l, std::size_t tokens, double seconds,
                                         machine const& m) {
  std::size_t const blocks = chunk_size(f.layers, l.pp, 0);
  double const weights =
      static_cast<double>(blocks * f.block.parameter_bytes + f.output.parameter_bytes) / sizeof(float);
  double const rate =
      m.gemm_flops * static_cast<double>(tokens) / (static_cast<double>(tokens) + m.gemm_half_rate_tokens);
  double const forward = seconds / (l.checkpointing ? 4.0 : 3.0);
  double const weight = std::min(2.0 * static_cast<double>(tokens) * weights / rate, seconds - forward);
  return {forward, seconds - forward - weight, weight};
}

/// Seconds of the data-parallel transfers and the optimizer of one step over `elements` parameter elements, of
/// which `root` are FSDP's root unit (gathered and reduced once per microbatch, within pipeline stages once per
/// step; the blocks gathered twice per microbatch, their gradients reduced once).
inline double data_parallel_seconds(std::size_t elements, std::size_t root, std::size_t tensors, layout const& l,
                                    precision p, machine const& m) {
  double const n = static_cast<double>(l.dp), e = static_cast<double>(elements);
  double const moved = (n - 1) / n * e;  // one pass of a ring over the elements
  double seconds = 0;
  if (l.dp > 1) {
    if (l.sharding == state_sharding::replicated)
      seconds = 2 * moved * static_cast<double>(p.gradient) / m.dp.bandwidth;
    if (l.sharding == state_sharding::zero1)
      seconds = moved * static_cast<double>(p.gradient + p.parameter) / m.dp.bandwidth;
    if (l.sharding == state_sharding::fsdp) {  // per microbatch: gathers, and the gradients reduce-scattered
      double const once = (n - 1) / n * static_cast<double>(root), microbatches = static_cast<double>(l.microbatches);
      double const root_passes = l.pp > 1 ? 1.0 : microbatches;  // a pipeline step keeps its root gathered
      seconds = (microbatches * (moved - once) * static_cast<double>(2 * p.parameter + p.gradient) +
                 root_passes * once * static_cast<double>(p.parameter + p.gradient)) /
                m.dp.bandwidth;
    }
    seconds += static_cast<double>(tensors) * m.dp.latency;
  }
  double const optimized = l.sharding == state_sharding::replicated ? e : std::ceil(e / n);
  // AdamW reads and writes the parameter and its moments and reads the gradient.
  return seconds + optimized * static_cast<double>(2 * p.parameter + p.gradient + 2 * p.optimizer) / m.memory_bandwidth;
}

}  // namespace detail

/// The memory per rank and step time of layout `l` for config `c`, batch `t` on machine `m`. The pipeline runs
/// 1F1B: stage k keeps min(pp - k, microbatches) microbatches' activations; the busiest rank is reported. ZB-H1
/// and ZBV (`l.schedule`) keep min(pp, microbatches) on every rank (not counting W's output gradients), and take
/// 1F1B's step times the ratio of their tables' timelines (schedule_time_ratio); ZBV puts both ends on rank 0.
inline estimate estimate_layout(model_description const& d, training_shape const& t, layout const& l,
                                machine const& m) {
  if (l.dp == 0 || l.pp == 0 || l.tp == 0 || l.cp == 0 || l.cp > most_context_ranks || l.microbatches == 0 ||
      t.sequence < l.cp || t.batch % (l.dp * l.microbatches) != 0 || t.batch == 0 || (l.cp > 1 && !d.context_parallel))
    shardwise::raise("shardwise::planner::estimate_layout: dp ", l.dp, ", pp ", l.pp, ", tp ", l.tp, ", cp ", l.cp,
                     " and ", l.microbatches, " microbatches cannot run a batch of ", t.batch, " sequences of ",
                     t.sequence, " tokens of ", d.family,
                     "; every size must be positive, dp x microbatches must divide the batch, the sequence hold a "
                     "token per cp rank, cp be at most ",
                     most_context_ranks,
                     ", and cp > 1 needs a model shardwise cuts over cp (the Llama family and GPT-2)");
  bool const v = l.pp > 1 && l.schedule == pipeline_choice::zero_bubble_v;
  if (v && d.layers % (2 * l.pp) != 0)
    shardwise::raise("shardwise::planner::estimate_layout: ZeroBubbleV over ", l.pp, " stages cuts the ", d.layers,
                     " layers into ", 2 * l.pp,
                     " chunks, which does not divide them; use 1F1B or ZB-H1, or a pp whose "
                     "double divides the layers");
  std::size_t const sequences = t.batch / (l.dp * l.microbatches);
  context_inputs const cut{l.cp, 0, t.sequence};  // cp rank 0 holds the largest piece
  std::size_t const tokens = sequences * cut.tokens(0);
  // The attention's panels span the sequence (this rank's keys at a time under cp), or a window and a panel under
  // a sliding window.
  std::size_t const span =
      d.sliding_window == 0 ? t.sequence : std::min(t.sequence, d.sliding_window + nn::attention_block_rows);
  model_figures const f = d.figures(l.cp > 1 ? cut.tokens(0) : span, tokens, l.tp, l.cp > 1 ? cut : context_inputs{});
  double const act_scale = static_cast<double>(t.bytes.activation) / sizeof(float);
  std::size_t const gradient_between_stages = chunk_size(tokens, l.tp, 0) * d.dim * sizeof(float);
  std::size_t working = f.block.working_bytes + 2 * gradient_between_stages;
  if (l.pp == 1) working += tokens * chunk_size(d.vocabulary, l.tp, 0) * sizeof(float);
  working = static_cast<std::size_t>(static_cast<double>(working) * act_scale);
  estimate e{l};
  std::size_t root = 0;  // the busiest stage's root unit under FSDP: what no block holds
  for (std::size_t stage = 0; stage < l.pp; ++stage) {
    bool const first = stage == 0, last = v ? stage == 0 : stage + 1 == l.pp;  // ZBV: both ends on rank 0
    std::size_t const elements = detail::stage_parameters(f, l, first, last);
    std::size_t const stage_root = elements - chunk_size(f.layers, l.pp, 0) * f.block.parameter_bytes / sizeof(float);
    std::size_t state = model_state_bytes(elements, l.dp * l.cp, l.sharding, t.bytes);
    if (l.sharding == state_sharding::fsdp)  // the stage's root unit and one block gathered whole, with gradients
      state += (stage_root + f.block.parameter_bytes / sizeof(float)) * (t.bytes.parameter + t.bytes.gradient);
    bool const split = l.pp > 1 && l.schedule != pipeline_choice::one_f_one_b;  // every stage holds pp (1F1B's first)
    std::size_t const in_flight = std::min(split ? l.pp : l.pp - stage, l.microbatches);
    std::size_t const recomputed = l.checkpointing ? f.block.activation_bytes : 0;  // one block at a time
    auto const activations = static_cast<std::size_t>(
        static_cast<double>(in_flight * detail::stage_activations(f, d, l, tokens, first, last) + recomputed) *
        act_scale);
    if (state + activations + working > e.bytes_per_rank()) {
      e.parameters = elements, e.state_bytes = state, e.activation_bytes = activations, e.working_bytes = working;
      root = stage_root;
    }
    if (!first && !last) stage = v ? l.pp : l.pp - 2;  // the middle stages hold no more than the first
  }
  double const boundary = static_cast<double>(chunk_size(tokens, l.tp, 0) * d.dim * t.bytes.activation);
  double const send = l.pp > 1 ? 2 * (m.pp.latency + boundary / m.pp.bandwidth) : 0;
  double const microbatch = detail::microbatch_seconds(f, d, l, t, tokens, m);
  double const ratio =
      schedule_time_ratio(l.schedule, l.pp, l.microbatches, detail::microbatch_split(f, l, tokens, microbatch, m));
  double const schedule = static_cast<double>(l.microbatches + l.pp - 1) * (microbatch + send) * ratio;
  std::size_t const tensors = d.tensors_per_layer * chunk_size(d.layers, l.pp, 0) + 3;
  layout replicas = l;  // the ranks that hold the same parameters: dp x cp
  replicas.dp = l.dp * l.cp;
  e.step_seconds = schedule + detail::data_parallel_seconds(e.parameters, root, tensors, replicas, t.bytes, m);
  e.tokens_per_second = static_cast<double>(t.batch * t.sequence) / e.step_seconds;
  return e;
}

/// As above, for a Llama config.
inline estimate estimate_layout(models::LlamaConfig const& c, training_shape const& t, layout const& l,
                                machine const& m) {
  return estimate_layout(describe(c), t, l, m);
}

/// What a search found: the layouts that fit, fastest first, and the one that needs the least memory.
struct search_result {
  std::vector<estimate> fitting;  ///< Within the memory limit, by step time.
  estimate smallest;              ///< The least memory per rank of all searched (fitting or not).
  std::size_t searched = 0;       ///< Layouts estimated.
};

/// Axis sizes a search keeps fixed (0: any).
struct axis_choice {
  std::size_t dp = 0;  ///< Data-parallel ranks, or 0.
  std::size_t pp = 0;  ///< Pipeline stages, or 0.
  std::size_t tp = 0;  ///< Tensor-parallel ranks, or 0.
  std::size_t cp = 0;  ///< Context-parallel ranks, or 0.
  /// The optimizer state's sharding to keep fixed, or std::nullopt for every kind.
  std::optional<state_sharding> sharding;
  /// The pipeline schedule of the layouts with stages (1F1B when not given; ZBV only where 2 pp divides the layers).
  std::optional<pipeline_choice> schedule;
};

namespace detail {
/// The microbatch counts, shardings and checkpointing of one dp x pp x tp x cp split (`base`), estimated into `r`.
inline void search_layouts(model_description const& d, training_shape const& t, layout const& base,
                           std::size_t memory_per_rank, machine const& m, axis_choice const& only, search_result& r) {
  std::size_t const dp = base.dp;
  for (std::size_t mb = 1; mb <= t.batch / dp; ++mb) {
    if ((t.batch / dp) % mb != 0) continue;
    for (auto s : {state_sharding::replicated, state_sharding::zero1, state_sharding::fsdp}) {
      if (s != state_sharding::replicated && dp * base.cp == 1) continue;
      if (only.sharding && s != *only.sharding) continue;
      for (bool checkpointing : {false, true}) {
        layout l = base;
        l.microbatches = mb, l.sharding = s, l.checkpointing = checkpointing;
        estimate const e = estimate_layout(d, t, l, m);
        if (r.searched++ == 0 || e.bytes_per_rank() < r.smallest.bytes_per_rank()) r.smallest = e;
        if (e.bytes_per_rank() <= memory_per_rank) r.fitting.push_back(e);
      }
    }
  }
}
}  // namespace detail

/// Every layout of `ranks` ranks (dp x pp x tp x cp = ranks; tp cutting the heads; pp up to the layers, 1F1B or
/// only.schedule; cp cutting each sequence, up to most_context_ranks, for the models shardwise cuts over cp; the
/// microbatches dividing each dp rank's sequences; the optimizer state replicated, ZeRO-1, or FSDP over dp x cp
/// (within pipeline stages too, each stage's gradients reduced after every microbatch); checkpointing off and on),
/// estimated and filtered by `memory_per_rank` bytes; `only` fixes axis sizes and the sharding.
inline search_result search(model_description const& d, training_shape const& t, std::size_t ranks,
                            std::size_t memory_per_rank, machine const& m, axis_choice only = {}) {
  search_result r;
  auto const allowed = [](std::size_t size, std::size_t fixed) { return fixed == 0 || size == fixed; };
  for (std::size_t tp = 1; tp <= ranks; ++tp) {
    if (ranks % tp != 0 || !tp_fits(d, tp) || !allowed(tp, only.tp)) continue;
    for (std::size_t pp = 1; pp <= ranks / tp && pp <= (d.pipeline ? d.layers : 1); ++pp) {
      if ((ranks / tp) % pp != 0 || !allowed(pp, only.pp)) continue;
      for (std::size_t cp = 1; cp <= ranks / tp / pp && cp <= most_context_ranks; ++cp) {
        bool const cuts = cp == 1 || (d.context_parallel && cp <= t.sequence);
        if ((ranks / tp / pp) % cp != 0 || !cuts || !allowed(cp, only.cp)) continue;
        std::size_t const dp = ranks / tp / pp / cp;
        if (t.batch % dp != 0 || !allowed(dp, only.dp)) continue;
        auto const schedule =
            pp > 1 ? only.schedule.value_or(pipeline_choice::one_f_one_b) : pipeline_choice::one_f_one_b;
        if (schedule == pipeline_choice::zero_bubble_v && d.layers % (2 * pp) != 0) continue;
        detail::search_layouts(d, t, layout{dp, pp, tp, 1, state_sharding::replicated, false, cp, schedule},
                               memory_per_rank, m, only, r);
      }
    }
  }
  std::sort(r.fitting.begin(), r.fitting.end(), [](estimate const& a, estimate const& b) {
    return a.step_seconds != b.step_seconds ? a.step_seconds < b.step_seconds : a.bytes_per_rank() < b.bytes_per_rank();
  });
  return r;
}

/// As above, for a Llama config.
inline search_result search(models::LlamaConfig const& c, training_shape const& t, std::size_t ranks,
                            std::size_t memory_per_rank, machine const& m, axis_choice only = {}) {
  return search(describe(c), t, ranks, memory_per_rank, m, only);
}

/// Parameter elements of the model `d` describes (the whole model, one copy).
inline std::size_t parameter_count(model_description const& d) {
  return detail::stage_parameters(d.figures(1, 1, 1, {}), layout{}, true, true);
}
/// As above, for a Llama config.
inline std::size_t parameter_count(models::LlamaConfig const& c) { return parameter_count(describe(c)); }

}  // namespace shardwise::planner
