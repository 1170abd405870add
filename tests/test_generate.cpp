// Generation with the key-value cache on the thread mesh at tp 1, 2 and 4 (generate_cases): Llama (grouped-query,
// and with kv_size_multiplier), GPT-2 and a user's decoder, every step's logits against the unsharded full
// forward; sampling's tokens the same at every tp size; stop tokens; the cache's bytes against its formula; the
// sampling rule on hand-worked cases; every bad request refused on every rank.
#include <doctest/doctest.h>

#include <filesystem>
#include <nlohmann/json.hpp>  // the configs as JSON values
#include <shardwise/models/gpt2_config_json.hpp>
#include <shardwise/models/llama_config_json.hpp>

#include "cases/generate_cases.hpp"
#include "support/worlds.hpp"

namespace {
namespace sw = shardwise;
namespace models = shardwise::models;
using namespace generate_cases;

Generated sampled_at_tp1() {
  Generated g;
  worlds::run_threads(1, [&](auto& world) { g = llama<float>(world, llama_config(), sampled()); });
  return g;
}
}  // namespace

TEST_CASE("generate: every step equals the full forward, and sampling is the same at tp 1, 2 and 4 (threads)") {
  auto const alone = sampled_at_tp1();
  CHECK(alone.tokens != llama<float>(sw::serial_world(), llama_config(), greedy()).tokens);  // it samples
  for (int ranks : {1, 2, 4}) worlds::run_threads(ranks, [&](auto& world) { all_cases(world, alone); });
}

TEST_CASE(
    "generate: with bf16_weights, every step equals the full forward of the weights rounded to bf16, at tp 1, 2 and "
    "4 (threads)") {
  for (int ranks : {1, 2, 4}) worlds::run_threads(ranks, [&](auto& world) { bf16_weights_cases(world); });
}

TEST_CASE("generate: a stop token ends its sequence, the others go on") {
  auto const p = prompts(61);
  Generated full, stopped;
  std::int64_t stop = 0;
  worlds::run_threads(2, [&](auto& world) {
    auto const g = llama<float>(world, llama_config(), greedy());
    auto o = greedy();
    o.stop_tokens = {g.tokens[1][3]};
    auto const s = llama<float>(world, llama_config(), o);
    if (world.rank() == 0) full = g, stopped = s, stop = o.stop_tokens[0];
  });
  for (std::size_t i = 0; i < p.size(); ++i) {
    auto const end = std::find(full.tokens[i].begin(), full.tokens[i].end(), stop);
    std::vector<std::int64_t> const expected(full.tokens[i].begin(), end == full.tokens[i].end() ? end : end + 1);
    CHECK(stopped.tokens[i] == expected);
  }
  CHECK(stopped.tokens[1].size() <= 4);
}

TEST_CASE("generate: the cache holds 2 x layers x local key-value columns x capacity x sequences elements") {
  for (int ranks : {1, 2, 4})
    for (std::size_t kv_heads : {std::size_t{2}, std::size_t{1}})
      worlds::run_threads(ranks, [&](auto& world) {
        auto const c = llama_config(kv_heads);
        auto const tp = tp_mesh(world);
        models::Llama<float, models::llama_plan<false>> model(c);
        sw::parallelize(model, tp);
        auto const g = sw::generate(model, tp, prompts(61), {.max_new_tokens = 3, .capacity = 30});
        // this rank's key-value heads: kv_heads, repeated up to tp where tp is larger, cut over tp
        std::size_t const local_heads = std::max<std::size_t>(kv_heads, std::size_t(ranks)) / std::size_t(ranks);
        CHECK(g.cache_bytes == 2 * c.layers * local_heads * c.head_dim() * 30 * 3 * sizeof(float));
        CHECK(g.cache_bytes == decltype(model)::kv_cache_bytes(c, std::size_t(ranks), 3, 30));  // the cost model's
      });
  // At compile time: 1 key-value head repeated to 4 ranks holds 1 head per rank; GPT-2's 4 heads over 4 ranks, 1.
  static_assert(models::Llama<float, models::llama_plan<false>>::kv_cache_bytes(
                    {.dim = 32, .heads = 4, .kv_heads = 1}, 4, 3, 30) == 2 * 2 * 8 * 30 * 3 * sizeof(float));
  static_assert(models::GPT2<double, models::gpt2_plan<false>>::kv_cache_bytes({.dim = 32, .heads = 4}, 4, 1, 40) ==
                2 * 2 * 8 * 40 * sizeof(double));
  // A layer with a sliding window keeps only the window's positions: Qwen2's window of 6 on the second of 2 layers.
  static_assert(models::Llama<float, models::llama_plan<false>>::kv_cache_bytes(
                    {.dim = 32, .heads = 4, .kv_heads = 1, .sliding_window = 6, .first_window_layer = 1}, 4, 3, 30) ==
                2 * (30 + 6) * 8 * 3 * sizeof(float));
  auto windowed = llama_config(2);
  windowed.sliding_window = 4;  // Mistral's: every layer
  sw::run_threads(2, [&](auto& world) {
    auto const tp = tp_mesh(world);
    models::Llama<float, models::llama_plan<false>> model(windowed);
    sw::parallelize(model, tp);
    auto const g = sw::generate(model, tp, prompts(61), {.max_new_tokens = 3, .capacity = 30});
    CHECK(g.cache_bytes == decltype(model)::kv_cache_bytes(windowed, 2, 3, 30));
    CHECK(g.cache_bytes * 30 == decltype(model)::kv_cache_bytes(llama_config(2), 2, 3, 30) * 4);  // 4 of 30 positions
  });
}

TEST_CASE("rotary_embedding: tables for the positions rotated, not for the 131,072 a config allows") {
  // Llama 3.2's max_position_embeddings at head_dim 64 would be 64 MiB of tables per layer.
  models::rotary_embedding<float> rope(131072, 64, 500000.0);
  CHECK(rope.positions() == 0);
  sw::nn::matrix<float> rows = sw::nn::matrix<float>::Ones(24, 2 * 64);  // 3 sequences of 8 tokens, 2 heads
  rope.rotate(rows, sw::sequence_lengths::every(8), nullptr);
  CHECK(rope.positions() == 8);
  rope.rotate(rows, sw::sequence_lengths::every(8), nullptr,
              true);  // the transpose undoes it: the rotation is orthogonal
  CHECK(rows.isApproxToConstant(1.0f, 1e-5f));
  sw::nn::matrix<float> step_rows = sw::nn::matrix<float>::Ones(2, 64);
  rope.rotate(step_rows, sw::cache_step{.entries = {{.start = 28, .count = 2}}, .capacity = 30});
  CHECK(rope.positions() == 30);  // the cache's capacity
  models::Llama<float, models::llama_plan<false>> model([] {
    auto c = llama_config();
    c.sequence = 131072;
    return c;
  }());  // builds no table
  worlds::run_threads(1, [&](auto& world) {
    auto const tp = tp_mesh(world);
    sw::parallelize(model, tp);
    CHECK(sw::generate(model, tp, prompts(61), {.max_new_tokens = 3, .capacity = 30}).tokens.size() == 3);
  });
}

TEST_CASE("sample_token: greedy, temperature, top-k and top-p on hand-worked probabilities") {
  // Logits log 1..4: probabilities 0.1, 0.2, 0.3, 0.4.
  std::vector<float> const logits{0.0f, std::log(2.0f), std::log(3.0f), std::log(4.0f)};
  auto pick = [&](sw::sampling s, double draw) { return sw::sample_token(std::span<const float>(logits), s, draw); };
  CHECK(pick({}, 0.0) == 3);
  CHECK(sw::sample_token(std::span<const float>(std::vector<float>{1, 5, 5, 2}), {}, 0.0) == 1);  // first maximum
  sw::sampling const plain{.temperature = 1};
  CHECK(pick(plain, 0.05) == 0);
  CHECK(pick(plain, 0.15) == 1);
  CHECK(pick(plain, 0.35) == 2);
  CHECK(pick(plain, 0.65) == 3);
  CHECK(pick({.temperature = 0.5}, 0.1) == 1);            // probabilities 1, 4, 9, 16 over 30: cumulative 5/30
  CHECK(pick({.temperature = 1, .top_k = 2}, 0.4) == 2);  // 3/7, 4/7
  CHECK(pick({.temperature = 1, .top_k = 2}, 0.45) == 3);
  CHECK(pick({.temperature = 1, .top_p = 0.75}, 0.2) == 1);  // cumulative 0.1 <= 0.25 removed: 2/9, 3/9, 4/9
  CHECK(pick({.temperature = 1, .top_p = 0.75}, 0.05) == 1);
  CHECK(pick({.temperature = 1, .top_p = 0.6}, 0.0) == 2);   // 0.1 and 0.3 <= 0.4 removed: 3/7, 4/7
  CHECK(pick({.temperature = 1, .top_p = 0.3}, 0.99) == 3);  // only the most likely left
}

TEST_CASE("generate: a MoeLlama with its experts over 1, 2 and 4 ranks equals its full forward (threads)") {
  for (int ranks : {1, 2, 4}) worlds::run_threads(ranks, [&](auto& world) { generate_cases::placed_experts(world); });
}

TEST_CASE("generate: bad requests are refused on every rank with the same words (threads)") {
  for (int ranks : {1, 2, 4}) worlds::run_threads(ranks, [&](auto& world) { bad_requests(world); });
}

TEST_CASE("llama_config_from_json: the rotary scaling in transformers 4's and 5's forms; others refused by name") {
  auto const base = std::string(R"({"model_type": "llama", "vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "max_position_embeddings": 256, )");
  auto const v5 =
      models::llama_config_from_json(base + R"("rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}})");
  CHECK(v5.rope_theta == 500000.0);
  CHECK_FALSE(v5.rope_scaling.scaled());
  auto const llama3 = R"("rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0)";
  for (std::string const scaled : {std::string(R"("rope_parameters": {"rope_theta": 500000.0, )") + llama3 + "}}",
                                   std::string(R"("rope_theta": 500000.0, "rope_scaling": {)") + llama3 + "}}"}) {
    auto const c = models::llama_config_from_json(base + scaled);
    CHECK(c.rope_scaling.type == models::rope_type::llama3);
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.rope_scaling.factor == 8.0);
    CHECK(c.rope_scaling.high_freq_factor == 4.0);
    CHECK(c.rope_scaling.original_max_positions == 256);       // transformers' default: max_position_embeddings
    models::Llama<float, models::llama_plan<false>> model(c);  // built, not refused
  }
  auto const yarn = models::llama_config_from_json(
      base + R"("rope_scaling": {"type": "yarn", "factor": null, "original_max_position_embeddings": 64}})");
  CHECK(yarn.rope_scaling.type == models::rope_type::yarn);
  CHECK(yarn.rope_scaling.factor == 4.0);  // transformers': max_position_embeddings / original
  CHECK(yarn.rope_scaling.beta_fast == 32.0);
  // dynamic (NTK): max_position_embeddings is where its lengths begin to raise the base, as transformers reads it.
  auto const dynamic = models::llama_config_from_json(
      base + R"("rope_scaling": {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 64}})");
  CHECK(dynamic.rope_scaling.type == models::rope_type::dynamic);
  CHECK(dynamic.rope_scaling.original_max_positions == 256);
  CHECK(!dynamic.rope_scaling.rescales(256));
  CHECK(dynamic.rope_scaling.rescales(257));
  for (char const* other : {"longrope", "su"}) {
    auto const text = base + R"("rope_scaling": {"rope_type": ")" + other + R"(", "factor": 2.0}})";
    std::string const message = error_of([&] { (void)models::llama_config_from_json(text); });
    INFO(message);
    CHECK(message.find(std::string("the rotary scaling \"") + other + "\" in config.json is not computed") !=
          std::string::npos);
  }
  models::LlamaConfig unsupported;
  unsupported.rope_scaling.type = models::rope_type::unsupported;
  CHECK(error_of([&] {
          models::Llama<float, models::llama_plan<false>> model(unsupported);
        }).find("a rotary scaling shardwise does not compute") != std::string::npos);
  CHECK(error_of([&] {
          (void)models::llama_config_from_json(base + R"("rope_scaling": {"rope_type": "llama3",
    "factor": 8.0, "low_freq_factor": 1.0}})");
        }).find("the llama3 rotary scaling in config.json has no \"high_freq_factor\"") != std::string::npos);
}

TEST_CASE("llama_config_from_json: every field that would change the numbers and is not computed is refused by name") {
  auto const base = std::string(R"({"model_type": "llama", "vocab_size": 61, "hidden_size": 32, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48, "max_position_embeddings": 256)");
  struct refusal {
    char const* field;
    char const* words;
  };
  for (auto const& [field, words] : std::initializer_list<refusal>{
           {R"("hidden_act": "gelu")", R"("hidden_act" in config.json is "gelu": shardwise's Llama computes SiLU)"},
           {R"("attention_dropout": 0.1)",
            R"("attention_dropout" in config.json is 0.1: shardwise's attention has no)"},
           {R"("partial_rotary_factor": 0.5)", R"("partial_rotary_factor" in config.json is 0.5: shardwise's Llama)"},
           {R"("rope_parameters": {"rope_type": "default", "partial_rotary_factor": 0.5})",
            R"("partial_rotary_factor" in config.json is 0.5)"},
           {R"("num_local_experts": 8)", R"("num_local_experts" in config.json is 8: a mixture of experts)"},
           {R"("num_experts": 4)", R"("num_experts" in config.json is 4: a mixture of experts)"},
           {R"("sliding_window": 64)", R"("sliding_window" in config.json is 64: transformers' Llama has no sliding)"},
           {R"("layer_types": ["full_attention", "chunked_attention"])",
            R"("layer_types" in config.json is ["full_attention","chunked_attention"]: shardwise builds one)"},
           {R"("layer_types": ["full_attention"])", R"("layer_types" in config.json is ["full_attention"]: shardwise)"},
           {R"("layer_types": ["full_attention", "sliding_attention"])",
            R"(is ["full_attention","sliding_attention"]: sliding layers with no window (sliding_window); give the)"},
           {R"("tie_word_embeddings": "yes")",
            R"("tie_word_embeddings" in config.json is "yes"; it must be true or)"}}) {
    std::string const message =
        error_of([&, f = field] { (void)models::llama_config_from_json(base + ", " + f + "}"); });
    INFO(field, " -> ", message);
    CHECK(message.find(words) != std::string::npos);
  }
  // Biases: Llama's attention_bias on all four attention projections and mlp_bias on the feed-forward's three;
  // Qwen2's on q, k and v only; Mistral none.
  auto const llama = models::llama_config_from_json(base + R"(, "attention_bias": true, "mlp_bias": true})");
  CHECK((llama.attention_bias && llama.attention_output_bias && llama.mlp_bias));
  // The same config as another model_type, with `rest` added.
  auto const family = [&](char const* type, std::string const& rest) {
    std::string text = base + ", " + rest + "}";
    text.replace(text.find("\"llama\""), 7, std::string("\"") + type + "\"");
    return text;
  };
  auto const qwen2 = models::llama_config_from_json(family("qwen2", R"("hidden_act": "silu")"));
  CHECK((qwen2.attention_bias && !qwen2.attention_output_bias && !qwen2.mlp_bias));
  auto const mistral = models::llama_config_from_json(family("mistral", R"("sliding_window": null)"));  // v0.2 on
  CHECK((!mistral.attention_bias && !mistral.attention_output_bias && !mistral.mlp_bias));
  CHECK(error_of([&] {
          (void)models::llama_config_from_json(family("gemma", R"("hidden_act": "silu")"));
        }).find("describes model_type \"gemma\", not \"llama\", \"qwen2\", \"qwen3\", \"mistral\", \"mixtral\"") !=
        std::string::npos);
  // Qwen3: q and k norms, attention_bias on all four projections, heads of head_dim (128 when left out).
  auto const qwen3 = models::llama_config_from_json(family("qwen3", R"("head_dim": 16, "attention_bias": true)"));
  CHECK((qwen3.qk_norm && qwen3.explicit_head_dim == 16 && qwen3.head_dim() == 16 && qwen3.attention_bias &&
         qwen3.attention_output_bias && !qwen3.mlp_bias));
  CHECK(models::llama_config_from_json(family("qwen3", R"("hidden_act": "silu")")).head_dim() == 128);
  CHECK(models::llama_config_from_json(base + R"(, "head_dim": 16})").head_dim() == 16);       // Llama's head_dim
  CHECK(models::llama_config_from_json(base + R"(, "head_dim": 8})").explicit_head_dim == 0);  // dim / heads
  CHECK(error_of([&] {
          (void)models::llama_config_from_json(base + R"(, "mlp_bias": "yes"})");
        }).find("\"mlp_bias\" in config.json is \"yes\"; it must be true or false") != std::string::npos);
  // The config.json written back is the family's: Qwen2's for biases on q, k and v only.
  CHECK(models::llama_config_to_json(qwen2)["model_type"] == "qwen2");
  CHECK(models::llama_config_from_json(models::llama_config_to_json(qwen2).dump()).fields() == qwen2.fields());
  CHECK(models::llama_config_from_json(models::llama_config_to_json(llama).dump()).fields() == llama.fields());
  CHECK(models::llama_config_to_json(qwen3)["model_type"] == "qwen3");
  CHECK(models::llama_config_from_json(models::llama_config_to_json(qwen3).dump()).fields() == qwen3.fields());
  models::LlamaConfig odd = llama;
  odd.attention_output_bias = false, odd.mlp_bias = true;
  CHECK(error_of([&] { (void)models::llama_config_to_json(odd); }).find("are neither a Llama's") != std::string::npos);
  // What cannot change the numbers is read as the model it describes.
  for (char const* harmless : {R"("hidden_act": "silu", "attention_bias": false, "mlp_bias": false)",
                               R"("attention_dropout": 0.0, "pretraining_tp": 1, "num_local_experts": 0)",
                               R"("sliding_window": null, "layer_types": ["full_attention", "full_attention"])",
                               R"("head_dim": 8, "rope_scaling": {}, "rope_parameters": {"rope_type": "default"})"}) {
    INFO(harmless);
    CHECK_NOTHROW((void)models::llama_config_from_json(base + ", " + harmless + "}"));
  }
  // A sliding window as transformers decides it: Mistral's always acts (4096 when the field is left out), Qwen2's
  // only with use_sliding_window and on the layers from max_window_layers (28 by default) on; layer_types, when
  // given, says which layers slide (the last ones).
  struct window_case {
    char const* type;
    char const* rest;
    std::size_t window, first;
  };
  for (auto const& [type, rest, window, first] : std::initializer_list<window_case>{
           {"mistral", R"("hidden_act": "silu")", 4096, 0},
           {"mistral", R"("use_sliding_window": false, "sliding_window": 64)", 64, 0},
           {"mistral", R"("sliding_window": null)", 0, 0},
           {"qwen2", R"("use_sliding_window": true, "sliding_window": 64, "max_window_layers": 1)", 64, 1},
           {"qwen2", R"("use_sliding_window": true, "num_hidden_layers": 30)", 4096, 28},
           {"qwen2", R"("use_sliding_window": true)", 0, 0},  // 2 layers, max_window_layers 28: none slides
           {"qwen2", R"("sliding_window": 64)", 0, 0},        // without use_sliding_window
           {"qwen2", R"("use_sliding_window": true, "sliding_window": 8, "layer_types": ["full_attention",
             "sliding_attention"])",
            8, 1},
           {"qwen2", R"("use_sliding_window": true, "layer_types": ["full_attention", "full_attention"])", 0, 0}}) {
    INFO(std::string(type), " ", std::string(rest));
    auto const c = models::llama_config_from_json(family(type, rest));
    CHECK(c.sliding_window == window);
    CHECK(c.first_window_layer == first);
    CHECK(c.window_at(first) == window);
    if (first > 0) CHECK(c.window_at(first - 1) == 0);
    if (window != 0) {  // written back as the family that has it, and read back the same
      CHECK(models::llama_config_to_json(c)["model_type"] == type);
      CHECK(models::llama_config_from_json(models::llama_config_to_json(c).dump()).fields() == c.fields());
    }
  }
  CHECK(error_of([&] {
          (void)models::llama_config_from_json(family("qwen2", R"("use_sliding_window": true, "sliding_window": 8,
            "layer_types": ["sliding_attention", "full_attention"])"));
        }).find("shardwise slides the window on the last layers only") != std::string::npos);
  models::LlamaConfig windowed_llama = llama;
  windowed_llama.sliding_window = 16;
  CHECK(error_of([&] {
          (void)models::llama_config_to_json(windowed_llama);
        }).find("a sliding window of 16 from layer 0 with these biases is neither") != std::string::npos);
  // A field left out takes the family's default: Qwen2's 32768 positions and 32 key-value heads, Mistral's 131072.
  std::string no_sizes = family("qwen2", R"("num_attention_heads": 32, "hidden_size": 64)");
  for (char const* field : {R"("num_key_value_heads": 2, )", R"("max_position_embeddings": 256, )"})
    no_sizes.erase(no_sizes.find(field), std::string(field).size());
  auto const qwen2_defaults = models::llama_config_from_json(no_sizes);
  CHECK(qwen2_defaults.sequence == 32768);
  CHECK(qwen2_defaults.kv_heads == 32);
  // The scaling: a non-empty rope_scaling wins over rope_parameters, as in transformers; per-layer-type parameters,
  // a truncate that is not a boolean, a zero attention factor and a number JSON cannot hold are refused.
  auto const linear = models::llama_config_from_json(base + R"(, "rope_parameters": {"rope_type": "default"},
    "rope_scaling": {"rope_type": "linear", "factor": 2.0}})");
  CHECK(linear.rope_scaling.type == models::rope_type::linear);
  auto const untruncated = models::llama_config_from_json(base + R"(, "rope_scaling": {"rope_type": "yarn",
    "factor": 4.0, "truncate": null}})");
  CHECK_FALSE(untruncated.rope_scaling.truncate);  // transformers: get("truncate", True) is None
  for (auto const& [rest, words] : std::initializer_list<std::pair<char const*, char const*>>{
           {R"("rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0}})",
            "rotary parameters per layer type are not computed"},
           {R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0, "truncate": "yes"})",
            "\"truncate\" in the yarn rotary scaling of config.json is \"yes\""},
           {R"("rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 0})",
            "has attention_factor 0; it must be positive"},
           {R"("rms_norm_eps": 1e400)", "is not valid JSON ([json.exception.out_of_range.406] number overflow"},
           {R"("rope_theta": 1.0, "rope_scaling": {"rope_type": "yarn", "factor": 4.0})",
            "yarn scaling with rope_theta 1"}}) {
    std::string const message =
        error_of([&, r = rest] { (void)models::llama_config_from_json(base + ", " + r + "}"); });
    INFO(std::string(rest), " -> ", message);
    CHECK(message.find(words) != std::string::npos);
  }
}

TEST_CASE(
    "llama_config_from_json: Mixtral, Qwen2-MoE and Qwen3-MoE read with their experts; what is not built refused") {
  auto const of = [](char const* type, std::string const& rest) {
    return std::string(R"({"model_type": ")") + type + R"(", "vocab_size": 61, "hidden_size": 32,
      "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 48,
      "max_position_embeddings": 256)" +
           rest + "}";
  };
  // Mixtral: the experts' width is intermediate_size, always renormalised; the loss weight only with
  // output_router_logits (transformers adds the loss only then).
  auto const mixtral = models::llama_config_from_json(of("mixtral", R"(, "num_local_experts": 6,
      "num_experts_per_tok": 3, "router_aux_loss_coef": 0.02, "output_router_logits": true, "sliding_window": null)"));
  REQUIRE(mixtral.moe);
  CHECK((mixtral.moe->experts == 6 && mixtral.moe->top_k == 3 && mixtral.moe->expert_hidden == 48 &&
         mixtral.moe->normalize_top_k && mixtral.moe->router_aux_loss_coef == 0.02 &&
         mixtral.moe->shared_expert_hidden == 0 && mixtral.sliding_window == 0 && !mixtral.attention_bias));
  CHECK(models::llama_config_from_json(of("mixtral", R"(, "router_aux_loss_coef": 0.02)")).moe->router_aux_loss_coef ==
        0);
  CHECK(models::llama_config_from_json(of("mixtral", R"(, "sliding_window": 16)")).sliding_window == 16);
  CHECK((mixtral.norm_eps == 1e-5 && mixtral.rope_theta == 1e6));  // MixtralConfig's defaults, not Llama's
  // Qwen2-MoE: its defaults (60 experts, top-4, width 1408, a gated shared expert of 5632), q, k and v biases.
  auto const qwen2 = models::llama_config_from_json(of("qwen2_moe", R"(, "qkv_bias": true)"));
  CHECK((qwen2.moe->experts == 60 && qwen2.moe->top_k == 4 && qwen2.moe->expert_hidden == 1408 &&
         !qwen2.moe->normalize_top_k && qwen2.moe->shared_expert_hidden == 5632 && qwen2.moe->shared_expert_gated &&
         qwen2.attention_bias && !qwen2.attention_output_bias));
  // Qwen3-MoE: the expert count under either name (its config saves num_local_experts), q and k norms.
  auto const qwen3 = models::llama_config_from_json(of("qwen3_moe", R"(, "num_local_experts": 8,
      "moe_intermediate_size": 24, "norm_topk_prob": true, "head_dim": 8, "mlp_only_layers": [],
      "decoder_sparse_step": 1)"));
  CHECK((qwen3.moe->experts == 8 && qwen3.moe->top_k == 8 && qwen3.moe->expert_hidden == 24 &&
         qwen3.moe->normalize_top_k && qwen3.qk_norm && qwen3.moe->shared_expert_hidden == 0));
  // Written back as the family it is, and read back the same.
  for (auto const& [c, type] : {std::pair{mixtral, "mixtral"}, {qwen2, "qwen2_moe"}, {qwen3, "qwen3_moe"}}) {
    auto const json = models::llama_config_to_json(c);
    CHECK(json["model_type"] == type);
    auto const back = models::llama_config_from_json(json.dump());
    CHECK(back.fields() == c.fields());
    CHECK((back.moe->top_k == c.moe->top_k && back.moe->normalize_top_k == c.moe->normalize_top_k &&
           back.moe->router_aux_loss_coef == c.moe->router_aux_loss_coef));
  }
  struct refusal {
    char const* type;
    char const* fields;
    char const* words;
  };
  for (auto const& [type, fields, words] : std::initializer_list<refusal>{
           {"qwen2_moe", R"(, "decoder_sparse_step": 2)",
            R"("decoder_sparse_step" in config.json is 2: shardwise builds every block with experts)"},
           {"qwen3_moe", R"(, "mlp_only_layers": [1])",
            R"("mlp_only_layers" in config.json is [1]: shardwise builds every block with experts)"},
           {"mixtral", R"(, "router_jitter_noise": 0.1)",
            R"("router_jitter_noise" in config.json is 0.1: shardwise's router adds no noise)"},
           {"qwen3_moe", R"(, "use_sliding_window": true)", R"("use_sliding_window" in config.json is true)"},
           {"mixtral", R"(, "num_local_experts": 4, "num_experts_per_tok": 5)",
            "shardwise::models::MoeConfig: top_k 5 is not in [1, experts = 4]"}}) {
    std::string const message = error_of([&, t = type, f = fields] { (void)models::llama_config_from_json(of(t, f)); });
    INFO(std::string(fields), " -> ", message);
    CHECK(message.find(words) != std::string::npos);
  }
}

TEST_CASE("config_to_json: what llama_config_to_json and gpt2_config_to_json write reads back the same") {
  std::string const data = SHARDWISE_TEST_DATA_DIR;
  auto const gpt2 = models::read_gpt2_config(data + "/gpt2_config.json");
  auto const gpt2_again = models::gpt2_config_from_json(models::gpt2_config_to_json(gpt2).dump());
  CHECK(gpt2_again.fields() == gpt2.fields());
  CHECK(gpt2_again.sequence == gpt2.sequence);
  auto const llama = models::read_llama_config(data + "/llama3_8b_config.json");
  auto const llama_again = models::llama_config_from_json(models::llama_config_to_json(llama).dump());
  CHECK(llama_again.fields() == llama.fields());
  CHECK(llama_again.sequence == llama.sequence);
  auto const scaled = models::read_llama_config(data + "/llama3_405b_config.json");
  auto const scaled_again = models::llama_config_from_json(models::llama_config_to_json(scaled).dump());
  CHECK(scaled_again.fields() == scaled.fields());  // the llama3 scaling's parameters among them
  CHECK(scaled.fields().at("rope_type") == "llama3");
  // write_llama_config writes the same config.json, whole, replacing what was there.
  auto const written = std::filesystem::temp_directory_path() / "shardwise_write_llama_config.json";
  std::filesystem::remove(written);
  models::write_llama_config(scaled, written);
  CHECK(models::read_llama_config(written).fields() == scaled.fields());
  models::write_llama_config(llama, written);
  CHECK(models::read_llama_config(written).fields() == llama.fields());
  std::filesystem::remove(written);
  // What `shardwise consolidate --names transformers-llama` writes back from a checkpoint's recorded fields.
  auto const yarn = models::llama_config_from_json(R"({"model_type": "llama", "vocab_size": 61, "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 256,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mscale": 0.7,
    "mscale_all_dim": 0.5, "truncate": false}})");
  auto const dynamic = models::llama_config_from_json(R"({"model_type": "llama", "vocab_size": 61,
    "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 48,
    "max_position_embeddings": 256, "rope_scaling": {"rope_type": "dynamic", "factor": 2.0}})");
  for (auto const& c : {scaled, yarn, dynamic}) {
    auto const recorded = c.fields();
    models::LlamaConfig back = c;
    back.rope_scaling = models::RopeScaling::from_fields(recorded);
    CHECK(back.fields() == recorded);
    CHECK(models::llama_config_from_json(models::llama_config_to_json(back).dump()).fields() == recorded);
  }
  CHECK(error_of([] {
          (void)models::RopeScaling::from_fields({{"rope_type", "longrope"}});
        }).find("the recorded rope_type \"longrope\" is not one shardwise computes") != std::string::npos);
  CHECK(error_of([] {
          (void)models::RopeScaling::from_fields({{"rope_type", "linear"}, {"rope_factor", "2x"}});
        }).find("the recorded rope_factor \"2x\" is not a number") != std::string::npos);
}

TEST_CASE("gpt2_config_from_json: GPT-2's published config; what shardwise's GPT-2 does not compute is refused") {
  std::string const data = SHARDWISE_TEST_DATA_DIR;
  auto const c = models::read_gpt2_config(data + "/gpt2_config.json");
  CHECK(c.vocabulary == 50257);
  CHECK(c.dim == 768);
  CHECK(c.layers == 12);
  CHECK(c.heads == 12);
  CHECK(c.sequence == 1024);
  CHECK(c.layer_norm_eps == 1e-5);
  CHECK(models::transformers_model_type(data + "/gpt2_config.json") == "gpt2");
  CHECK(models::transformers_model_type(data + "/llama3_8b_config.json") == "llama");
  CHECK(models::read_llama_config(data + "/llama3_405b_config.json").rope_scaling.type ==
        models::rope_type::llama3);  // Llama 3.1's scaling
  CHECK_FALSE(models::read_llama_config(data + "/llama3_8b_config.json").rope_scaling.scaled());
  auto const base = std::string(R"({"vocab_size": 61, "n_embd": 32, "n_layer": 2, "n_head": 4, "n_positions": 40)");
  auto refused = [&](std::string const& rest, std::string const& words) {
    std::string const message = error_of([&] { (void)models::gpt2_config_from_json(base + rest); });
    INFO(message);
    CHECK(message.find(words) != std::string::npos);
  };
  CHECK(models::gpt2_config_from_json(base + "}").dim == 32);
  refused(R"(, "activation_function": "relu"})", "has activation_function \"relu\"; shardwise's GPT-2 computes");
  refused(R"(, "n_inner": 100})", "\"n_inner\" in config.json is not 4 x n_embd");
  refused(R"(, "model_type": "llama"})", "describes model_type \"llama\", not \"gpt2\"");
  refused(R"(, "n_head": 0})", "\"n_head\" in config.json is 0; it must be a positive whole number");
  refused("}{", "is not valid JSON");
  std::string const missing = error_of([] { (void)models::gpt2_config_from_json(R"({"n_embd": 32})"); });
  CHECK(missing.find("gpt2_config_from_json: config.json has no \"vocab_size\"") != std::string::npos);
}
