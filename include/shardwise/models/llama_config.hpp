#pragma once
// The Llama model's configuration (LlamaConfig, with its checks and the fields saved beside its weights) and the
// kv_size_multiplier that lets more tp ranks than key-value heads serve grouped-query attention (the rotary
// embedding is models/rotary_embedding.hpp).
#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/models/moe_config.hpp"
#include "shardwise/models/rope_scaling.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"
#include "shardwise/nn/layers/init.hpp"
#include "shardwise/nn/layers/layer_common.hpp"

namespace shardwise::models {

/// The sizes and settings of a Llama model.
struct LlamaConfig {
  std::size_t vocabulary = 256;  ///< Token ids are in [0, vocabulary).
  std::size_t dim = 64;          ///< The model (embedding) width.
  std::size_t layers = 2;        ///< Number of decoder blocks.
  std::size_t heads = 4;         ///< Query heads.
  std::size_t kv_heads = 2;      ///< Key-value heads (grouped-query: each serves heads / kv_heads query heads).
  std::size_t hidden = 176;      ///< The feed-forward's inner width.
  double norm_eps = 1e-5;        ///< RMSNorm's epsilon.
  double rope_theta = 10000.0;   ///< The rotary embedding's base.
  std::size_t sequence = 32;     ///< Tokens per sequence; a batch is rows of whole sequences.
  init seed = 1234;              ///< Seed of the initial parameters (sw::Lazy marks it "declared only").
  /// optimum-neuron's kv_size_multiplier: how many times each key-value head is repeated before wk and wv are
  /// cut, so that more tp ranks than key-value heads each hold the head their query heads use. 0: derived
  /// (tp / kv_heads when tp exceeds kv_heads, else 1).
  std::size_t kv_size_multiplier = 0;
  /// transformers' tie_word_embeddings: the output projection computes with the token embedding's table (one
  /// tensor, one gradient, one optimizer state, saved once as the embedding).
  bool tie_word_embeddings = false;
  /// Biases on wq, wk and wv (transformers' Llama attention_bias; Qwen2 always has them), each cut as its weight
  /// is: sharded with the heads under ColwiseParallel.
  bool attention_bias = false;
  /// A bias on wo (transformers' Llama attention_bias; Qwen2 has none), added once after the reduction under
  /// RowwiseParallel.
  bool attention_output_bias = false;
  /// Biases on w1, w3 (cut with their rows) and w2 (added once): transformers' mlp_bias.
  bool mlp_bias = false;
  /// How the rotary embedding's frequencies are scaled (transformers' rope_scaling or rope_parameters: "linear",
  /// "llama3", "yarn"; none by default).
  RopeScaling rope_scaling{};
  /// Sliding-window attention (Mistral's sliding_window; Qwen2's with use_sliding_window): on the layers it acts
  /// on, a token attends to itself and the sliding_window - 1 tokens before it. 0: the whole sequence.
  std::size_t sliding_window = 0;
  /// The first layer the window acts on; it acts on every layer from there (Qwen2's max_window_layers; 0: every
  /// layer, as Mistral's).
  std::size_t first_window_layer = 0;
  /// The window of layer `layer`: sliding_window from first_window_layer on, 0 (none) before.
  [[nodiscard]] constexpr std::size_t window_at(std::size_t layer) const {
    return layer >= first_window_layer ? sliding_window : 0;
  }
  /// The config as layer `layer` sees it: its own window (window_at) on every layer.
  [[nodiscard]] constexpr LlamaConfig for_layer(std::size_t layer) const {
    LlamaConfig c = *this;
    c.sliding_window = window_at(layer), c.first_window_layer = 0;
    return c;
  }
  /// transformers' head_dim where a head is not dim / heads wide (Qwen3-0.6B: 16 heads of 128 on a width of
  /// 1024); 0: dim / heads. wq is then dim -> heads * head_dim and wo heads * head_dim -> dim.
  std::size_t explicit_head_dim = 0;
  /// Qwen3's q_norm and k_norm: an RMSNorm over each head's query and key (one weight of head_dim shared by the
  /// heads), before the rotary embedding.
  bool qk_norm = false;
  /// A mixture of experts in place of every block's dense feed-forward (Mixtral's, Qwen2-MoE's and Qwen3-MoE's
  /// sparse blocks; `hidden` is then unused), which the model type must hold (models::MoeLlama); none: dense. Its
  /// dim and mlp_bias are the model's (experts()).
  std::optional<MoeConfig> moe = std::nullopt;
  /// The mixture of experts as each block builds it: `moe` with the model's dim and mlp_bias.
  [[nodiscard]] constexpr MoeConfig experts() const {
    if (!moe)
      shardwise::raise(
          "shardwise::models::LlamaConfig: the config has no experts (moe is empty); give it a "
          "MoeConfig, or build the dense models::Llama");
    MoeConfig m = *moe;
    m.dim = dim, m.mlp_bias = mlp_bias;
    return m;
  }
  /// Width of one attention head: explicit_head_dim, or dim / heads.
  [[nodiscard]] constexpr std::size_t head_dim() const {
    return explicit_head_dim != 0 ? explicit_head_dim : dim / heads;
  }

  /// The fields that decide what the weights mean, as text, saved beside them by save_sharded and compared by
  /// load_sharded (sequence, seed and kv_size_multiplier do not change a weight's meaning); a scaled rotary
  /// embedding adds its parameters.
  [[nodiscard]] std::map<std::string, std::string> fields() const;

  /// Throws, naming the field and the fix, for sizes no model can have: zeros, head counts that do not divide,
  /// an odd head width (the rotary embedding rotates pairs), or tables too large to index.
  constexpr void check() const {
    auto const positive = [](char const* field, std::size_t value) {
      if (value == 0) shardwise::raise("shardwise::models::LlamaConfig: ", field, " is 0; give it a positive size");
    };
    positive("vocabulary", vocabulary), positive("dim", dim), positive("heads", heads);
    positive("kv_heads", kv_heads), positive("hidden", hidden), positive("sequence", sequence);
    if (explicit_head_dim == 0 && dim % heads != 0)
      shardwise::raise("shardwise::models::LlamaConfig: dim ", dim, " is not a multiple of heads ", heads,
                       "; choose dim = heads * head width, or give explicit_head_dim");
    if (heads % kv_heads != 0)
      shardwise::raise("shardwise::models::LlamaConfig: heads ", heads, " is not a multiple of kv_heads ", kv_heads,
                       "; every key-value head must serve the same number of query heads");
    if (head_dim() % 2 != 0)
      shardwise::raise("shardwise::models::LlamaConfig: the head width ", head_dim(),
                       " is odd; the rotary embedding needs an even one");
    constexpr std::size_t limit = std::size_t{1} << 40;  // elements in one table; far beyond any model here
    if (vocabulary > limit / dim || hidden > limit / dim || sequence > limit / head_dim() ||
        heads > limit / head_dim() / dim)
      shardwise::raise("shardwise::models::LlamaConfig: vocabulary ", vocabulary, ", hidden ", hidden, " or sequence ",
                       sequence, " times dim ", dim, " overflows a table; check the sizes");
    if (!(norm_eps > 0) || !(rope_theta > 0))
      shardwise::raise("shardwise::models::LlamaConfig: norm_eps ", norm_eps, " and rope_theta ", rope_theta,
                       " must be positive");
    rope_scaling.check();
    if (moe) experts().check();
    if (rope_scaling.type == rope_type::yarn && !(rope_theta > 1))
      shardwise::raise("shardwise::models::LlamaConfig: yarn scaling with rope_theta ", rope_theta,
                       "; its ramp divides by log(rope_theta): give a base above 1");
  }
};

/// The kv_size_multiplier that lets `tp` ranks serve `heads` query heads and `kv_heads` key-value heads, each
/// rank holding whole heads and the key-value heads its query heads use; `requested` 0 derives it. Returns 0
/// when no multiplier can (the heads do not divide over tp, or tp neither divides the key-value heads nor is a
/// multiple of them).
constexpr std::size_t kv_size_multiplier(std::size_t heads, std::size_t kv_heads, std::size_t tp,
                                         std::size_t requested = 0) {
  if (tp == 0 || kv_heads == 0 || heads % kv_heads != 0 || heads % tp != 0) return 0;
  std::size_t const m = requested != 0 ? requested : kv_heads % tp == 0 ? 1 : tp % kv_heads == 0 ? tp / kv_heads : 0;
  if (m == 0 || (kv_heads * m) % tp != 0) return 0;
  std::size_t const local_q = heads / tp, local_kv = kv_heads * m / tp;
  if (local_kv == 0 || local_q % local_kv != 0) return 0;
  // Every rank's query head must find its own key-value head among the repeated ones it holds.
  for (std::size_t rank = 0; rank < tp; ++rank)
    for (std::size_t i = 0; i < local_q; ++i) {
      std::size_t const needed = (rank * local_q + i) / (heads / kv_heads);
      std::size_t const held = (rank * local_kv + i / (local_q / local_kv)) / m;
      if (needed != held) return 0;
    }
  return m;
}

// Compiled once with checkpoint IO where shardwise::separate_checkpoint is linked (checkpoint/compiled_once.hpp).
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::map<std::string, std::string> LlamaConfig::fields() const {
  std::map<std::string, std::string> f{{"vocabulary", std::to_string(vocabulary)},
                                       {"dim", std::to_string(dim)},
                                       {"layers", std::to_string(layers)},
                                       {"heads", std::to_string(heads)},
                                       {"kv_heads", std::to_string(kv_heads)},
                                       {"hidden", std::to_string(hidden)},
                                       {"norm_eps", shardwise::config_number(norm_eps)},
                                       {"rope_theta", shardwise::config_number(rope_theta)},
                                       {"tie_word_embeddings", tie_word_embeddings ? "true" : "false"},
                                       {"attention_bias", attention_bias ? "true" : "false"},
                                       {"attention_output_bias", attention_output_bias ? "true" : "false"},
                                       {"mlp_bias", mlp_bias ? "true" : "false"}};
  f.merge(rope_scaling.fields());
  if (explicit_head_dim != 0 && explicit_head_dim * heads != dim) f["head_dim"] = std::to_string(explicit_head_dim);
  if (moe) f.merge(moe->fields());
  if (qk_norm) f["qk_norm"] = "true";  // new fields recorded only when set, as the window below
  if (sliding_window != 0)             // recorded only when set, so checkpoints from before windows load as they did
    f["sliding_window"] = std::to_string(sliding_window), f["first_window_layer"] = std::to_string(first_window_layer);
  return f;
}
#endif

}  // namespace shardwise::models
