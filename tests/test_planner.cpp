// The planner behind `shardwise plan` (shardwise::planner): transformers' Llama 3 configs read as published,
// parameter counts and per-rank memory against arithmetic written out here, the ZeRO paper's model-state
// figures, the search over layouts, and the errors for bad input.
#include <doctest/doctest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <shardwise/models/llama_config_json.hpp>
#include <shardwise/planner/calibrate.hpp>
#include <shardwise/planner/llama.hpp>
#include <shardwise/planner/machine_file.hpp>
#include <shardwise/planner/models.hpp>
#include <string>
#include <utility>
#include <vector>

namespace sw = shardwise;
namespace planner = shardwise::planner;

namespace {

std::string const data = SHARDWISE_TEST_DATA_DIR;

/// Parameters of a Llama config, written out from the architecture: per layer q and o (dim x dim), k and v
/// (dim x kv_heads x head width), the SwiGLU's three (dim x hidden) and two norms; the embedding and output
/// tables and the final norm.
std::size_t llama_parameters(std::size_t vocabulary, std::size_t dim, std::size_t layers, std::size_t heads,
                             std::size_t kv_heads, std::size_t hidden) {
  std::size_t const kv = kv_heads * (dim / heads);
  std::size_t const layer = 2 * dim * dim + 2 * dim * kv + 3 * dim * hidden + 2 * dim;
  return layers * layer + 2 * vocabulary * dim + dim;
}

/// The message of what `f` throws ("" if nothing).
template <class F>
std::string thrown(F&& f) {
  try {
    f();
  } catch (std::exception const& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("planner: the Llama 3 configs read as published, with their parameter counts") {
  struct expected {
    char const* file;
    std::size_t dim, layers, heads, kv_heads, hidden, sequence, parameters;
  };
  // Published totals: 8.03 B, 70.55 B (70.6 B), 405.85 B (meta-llama model cards).
  for (auto const& e : {expected{"llama3_8b_config.json", 4096, 32, 32, 8, 14336, 8192, 8'030'261'248},
                        expected{"llama3_70b_config.json", 8192, 80, 64, 8, 28672, 8192, 70'553'706'496},
                        expected{"llama3_405b_config.json", 16384, 126, 128, 8, 53248, 131072, 405'853'388'800}}) {
    CAPTURE(e.file);
    auto const c = sw::models::read_llama_config(data + "/" + e.file);
    CHECK(c.vocabulary == 128256);
    CHECK(c.dim == e.dim);
    CHECK(c.layers == e.layers);
    CHECK(c.heads == e.heads);
    CHECK(c.kv_heads == e.kv_heads);
    CHECK(c.hidden == e.hidden);
    CHECK(c.sequence == e.sequence);
    CHECK(c.rope_theta == 500000.0);
    CHECK(c.norm_eps == 1e-5);
    CHECK_FALSE(c.tie_word_embeddings);
    CHECK(llama_parameters(c.vocabulary, c.dim, c.layers, c.heads, c.kv_heads, c.hidden) == e.parameters);
    CHECK(planner::parameter_count(c) == e.parameters);
  }
}

TEST_CASE("planner: model-state bytes equal the ZeRO paper's (Figure 1: 7.5 B parameters, 64 GPUs, K = 12)") {
  // Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter Models" (SC20), Figure 1:
  // baseline 120 GB, P_os 31.4 GB, P_os+g+p 1.9 GB per device (GB = 1e9 bytes).
  std::size_t const psi = 7'500'000'000;
  CHECK(planner::model_state_bytes(psi, 64, planner::state_sharding::replicated, planner::bf16_mixed) ==
        120'000'000'000);
  CHECK(planner::model_state_bytes(psi, 64, planner::state_sharding::zero1, planner::bf16_mixed) == 31'406'250'000);
  CHECK(planner::model_state_bytes(psi, 64, planner::state_sharding::fsdp, planner::bf16_mixed) == 1'875'000'000);
}

TEST_CASE("planner: a layout's memory per rank, against the arithmetic of the 8B model at tp 8, dp 2, ZeRO-1") {
  auto const c = sw::models::read_llama_config(data + "/llama3_8b_config.json");
  planner::training_shape const shape{16, 2048, planner::bf16_mixed};
  planner::layout const l{2, 1, 8, 4, planner::state_sharding::zero1, false};
  auto const e = planner::estimate_layout(c, shape, l, planner::machine{});
  // Per layer every weight is cut 8 ways, the two norms are whole; the vocabulary-parallel tables are cut 8 ways.
  std::size_t const layer = (2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336) / 8 + 2 * 4096;
  std::size_t const elements = 32 * layer + 2 * 128256 * 4096 / 8 + 4096;
  CHECK(e.parameters == elements);
  CHECK(e.state_bytes == elements * (2 + 2) + (elements + 1) / 2 * 12);
  // Two sequences of 2048 tokens per microbatch (16 / dp 2 / 4): the activations are held for one.
  auto const one = planner::estimate_layout(c, shape, planner::layout{2, 1, 8, 4, planner::state_sharding::zero1, true},
                                            planner::machine{});
  CHECK(one.activation_bytes < e.activation_bytes / 4);  // checkpointing keeps each block's input only
  CHECK(one.step_seconds > e.step_seconds);              // and runs every block's forward again
  // A backward's transients, once: the block's (its peak: in the attention's branch, which runs beside the gradient
  // the feed-forward's branch passed on, this rank's tokens x 4096; in it wo's input gradient and q, k and v's
  // gradients held throughout, and beside them first the blocked attention's two panels of 128 query rows x 2048
  // keys, then, once those are freed, three input gradients, summed into the first), the gradient given and the
  // one passed on (this rank's tokens under sequence parallelism) and, at pp 1, the logits' gradient
  // (tokens x vocabulary / 8); in the activation type's bytes (bf16: 2).
  std::size_t const tokens = 2 * 2048, hidden = 14336 / 8;
  std::size_t const feed_forward = std::max(2 * tokens * hidden + tokens * 4096, tokens * hidden + 2 * tokens * 4096);
  std::size_t const attention =
      tokens * 4096 / 8 + tokens * (4096 + 2 * 1024) / 8 + std::max<std::size_t>(2 * 128 * 2048, 3 * tokens * 4096);
  CHECK(attention > feed_forward);
  CHECK(e.working_bytes == (tokens / 8 * 4096 + attention + 2 * tokens / 8 * 4096 + tokens * 128256 / 8) * 2);
  CHECK(e.bytes_per_rank() == e.state_bytes + e.activation_bytes + e.working_bytes);
}

TEST_CASE("planner: 1F1B keeps min(pp, microbatches) microbatches on the first stage") {
  auto const c = sw::models::read_llama_config(data + "/llama3_8b_config.json");
  planner::training_shape const shape{64, 1024, planner::bf16_mixed};
  planner::machine const m;
  auto const at = [&](std::size_t microbatches, std::size_t sequences_per_microbatch) {
    std::size_t const dp = 64 / (microbatches * sequences_per_microbatch);
    return planner::estimate_layout(c, shape, planner::layout{dp, 4, 2, microbatches}, m).activation_bytes;
  };
  // The same microbatch size (one sequence) with 2, 4 and 16 microbatches: 2, 4 and 4 in flight.
  CHECK(at(4, 1) == 2 * at(2, 1));
  CHECK(at(16, 1) == at(4, 1));
  // A backward's transients do not grow with the microbatches in flight: one backward runs at a time.
  auto const working = [&](std::size_t microbatches) {
    return planner::estimate_layout(c, shape, planner::layout{64 / microbatches, 4, 2, microbatches}, m).working_bytes;
  };
  CHECK(working(4) == working(2));
  CHECK(working(2) > 0);
}

TEST_CASE("planner: the search covers the layouts of the rank count, fitting ones fastest first") {
  auto const c = sw::models::read_llama_config(data + "/llama3_70b_config.json");
  planner::training_shape const shape{1024, 8192, planner::bf16_mixed};
  std::size_t const limit = std::size_t{80} << 30;
  for (std::size_t ranks : {1024, 16384}) {
    CAPTURE(ranks);
    auto const found = planner::search(c, shape, ranks, limit, planner::machine{});
    REQUIRE_FALSE(found.fitting.empty());
    CHECK(found.searched > found.fitting.size());
    for (std::size_t i = 0; i < found.fitting.size(); ++i) {
      auto const& e = found.fitting[i];
      CHECK(e.plan.dp * e.plan.pp * e.plan.tp * e.plan.cp == ranks);
      CHECK(e.bytes_per_rank() <= limit);
      CHECK(shape.batch % (e.plan.dp * e.plan.microbatches) == 0);
      if (i > 0) CHECK(found.fitting[i - 1].step_seconds <= e.step_seconds);
    }
  }
  auto const crowded = planner::search(c, shape, 8, limit, planner::machine{});
  CHECK(crowded.fitting.empty());
  CHECK(crowded.smallest.bytes_per_rank() > limit);
  auto const huge = sw::models::read_llama_config(data + "/llama3_405b_config.json");
  CHECK_FALSE(
      planner::search(huge, planner::training_shape{2048, 8192}, 16384, limit, planner::machine{}).fitting.empty());
}

TEST_CASE("planner: bad config files and machine files are named with the fix") {
  CHECK(thrown([] {
          (void)sw::models::read_llama_config(data + "/broken_config.json");
        }).find("broken_config.json is not valid JSON (") != std::string::npos);
  CHECK(thrown([] { (void)sw::models::read_llama_config(data + "/no_such_config.json"); }).find("cannot open") !=
        std::string::npos);
  CHECK(thrown([] {
          (void)sw::models::llama_config_from_json(R"({"model_type": "gpt2"})");
        }).find("describes model_type \"gpt2\", not \"llama\"") != std::string::npos);
  CHECK(thrown([] {
          (void)sw::models::llama_config_from_json(
              R"({"vocab_size": 10, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 8})");
        }).find("has no \"hidden_size\"") != std::string::npos);
  CHECK(thrown([] {
          (void)sw::models::llama_config_from_json(
              R"({"vocab_size": 10, "hidden_size": -4, "num_hidden_layers": 2, "num_attention_heads": 2})");
        }).find("\"hidden_size\" in config.json is -4; it must be a positive whole number") != std::string::npos);
  CHECK(thrown([] { (void)planner::read_machine(data + "/broken_config.json"); }).find("is not valid JSON") !=
        std::string::npos);
  auto const machine_with = [](char const* json) {
    auto const file = std::filesystem::temp_directory_path() / "shardwise_test_planner_machine.json";
    std::ofstream(file) << json;
    return [file] { return planner::read_machine(file); };
  };
  CHECK(thrown(machine_with(R"({"gemm_half_rate_tokens": -3})")).find("\"gemm_half_rate_tokens\" in ") !=
        std::string::npos);
  CHECK(machine_with(R"({"gemm_half_rate_tokens": 0})")().gemm_half_rate_tokens == 0);  // a flat GEMM rate
  // Not an object of rates, or rates no machine has: refused, instead of a plan at inf or 0 tokens/s.
  CHECK(thrown(machine_with("[1, 2]")).find("the file in ") != std::string::npos);
  CHECK(thrown(machine_with("[1, 2]")).find("is a JSON array, not an object of rates") != std::string::npos);
  CHECK(thrown(machine_with(R"({"tp": 5})")).find("\"tp\" in ") != std::string::npos);
  CHECK(thrown(machine_with(R"({"tp": 5})")).find("is a JSON number, not an object of rates") != std::string::npos);
  CHECK(thrown(machine_with(R"({"gemm_flops": 1e300})")).find("\"gemm_flops\" in ") != std::string::npos);
  CHECK(thrown(machine_with(R"({"gemm_flops": 1e300})"))
            .find(" is 1e+300; a rank's GEMM rate must be a number from 1000 to 1e+18 FLOP/s; measure this machine "
                  "with bench_machine") != std::string::npos);
  // Physically impossible rates, however small: each names its field, the value and the range.
  CHECK(thrown(machine_with(R"({"gemm_flops": 1e-300})")).find("\"gemm_flops\" in ") != std::string::npos);
  CHECK(thrown(machine_with(R"({"gemm_flops": 1e-300})")).find(" is 1e-300; a rank's GEMM rate must be") !=
        std::string::npos);
  CHECK(thrown(machine_with(R"({"memory_bandwidth": 1e-300})")).find("\"memory_bandwidth\" in ") != std::string::npos);
  CHECK(thrown(machine_with(R"({"memory_bandwidth": 1e300})"))
            .find("a rank's memory bandwidth must be a number from 1000 to 1e+15 bytes/s") != std::string::npos);
  CHECK(thrown(machine_with(R"({"tp": {"bandwidth": 1e-300}})"))
            .find("a link's bandwidth must be a number from 1000 to 1e+15 bytes/s") != std::string::npos);
  CHECK(thrown(machine_with(R"({"pp": {"latency": 1e-300}})"))
            .find("a link's latency must be a number from 1e-09 to 60 seconds") != std::string::npos);
  CHECK(thrown(machine_with(R"({"gemm_half_rate_tokens": 1e300})"))
            .find("the tokens at half the GEMM rate must be a number from 0 to 1e+09 tokens") != std::string::npos);
  CHECK(machine_with(R"({"gemm_flops": 1e3, "memory_bandwidth": 1e15})")().gemm_flops == 1e3);  // the bounds
  CHECK(thrown(machine_with(R"({"dp": {"latency": 1e-300, "bandwidth": 1e300}})")).find("\"bandwidth\" in ") !=
        std::string::npos);
}

TEST_CASE("planner: config and machine files nested deeper than any real one, or a FIFO, are refused at once") {
  std::string const deep = "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}";
  CHECK(thrown([&] { (void)sw::models::llama_config_from_json(deep); }).find("config.json nests JSON 65 deep") !=
        std::string::npos);
  auto const file = std::filesystem::temp_directory_path() / "shardwise_test_planner_deep.json";
  std::ofstream(file) << deep;
  CHECK(thrown([&] { (void)planner::read_machine(file); }).find("nests JSON 65 deep; a machine file is") !=
        std::string::npos);
  std::filesystem::remove(file);
  auto const fifo = std::filesystem::temp_directory_path() / "shardwise_test_planner_fifo.json";
  std::filesystem::remove(fifo);
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK(thrown([&] { (void)sw::models::read_llama_config(fifo); }).find("is not a regular file") != std::string::npos);
  CHECK(thrown([&] { (void)planner::read_machine(fifo); }).find("is not a regular file") != std::string::npos);
  std::filesystem::remove(fifo);
}

TEST_CASE("planner: a machine file's GEMM rate curve is read, and small microbatches run slower") {
  auto const h100 = planner::read_machine(std::string(SHARDWISE_SOURCE_DIR) + "/tools/machines/h100_cluster.json");
  CHECK(h100.gemm_half_rate_tokens == 256);  // not the built-in default
  CHECK(h100.gemm_flops == 400e12);
  auto const c = sw::models::read_llama_config(data + "/llama3_8b_config.json");
  planner::layout const l{1, 1, 1, 1};
  planner::machine flat = h100, curved = h100;
  flat.gemm_half_rate_tokens = 0;
  double const long_flat = planner::estimate_layout(c, {1, 8192, planner::bf16_mixed}, l, flat).step_seconds;
  double const long_curved = planner::estimate_layout(c, {1, 8192, planner::bf16_mixed}, l, curved).step_seconds;
  double const short_flat = planner::estimate_layout(c, {1, 64, planner::bf16_mixed}, l, flat).step_seconds;
  double const short_curved = planner::estimate_layout(c, {1, 64, planner::bf16_mixed}, l, curved).step_seconds;
  CHECK(long_curved > long_flat);
  CHECK(long_curved < 1.04 * long_flat);  // 8192 tokens: the GEMMs within 3% of the peak rate
  // 64 tokens: the GEMMs at a fifth of the peak rate; the optimizer's pass, the same in both, dilutes it.
  CHECK(short_curved / short_flat > 1.1 * (long_curved / long_flat));
}

TEST_CASE("planner: the default machine is tools/machines/this_machine.json") {
  auto const file = planner::read_machine(std::string(SHARDWISE_SOURCE_DIR) + "/tools/machines/this_machine.json");
  planner::machine const built_in;
  CHECK(file.name == built_in.name);
  CHECK(file.measured == built_in.measured);
  CHECK_FALSE(built_in.measured.empty());
  auto const assumed = planner::read_machine(std::string(SHARDWISE_SOURCE_DIR) + "/tools/machines/h100_cluster.json");
  CHECK(assumed.measured.empty());  // a file without the field is not dated with the default's day
  CHECK(file.gemm_flops == built_in.gemm_flops);
  CHECK(file.gemm_half_rate_tokens == built_in.gemm_half_rate_tokens);
  CHECK(file.memory_bandwidth == built_in.memory_bandwidth);
  CHECK(file.ranks_per_node == built_in.ranks_per_node);
  for (auto [a, b] :
       {std::pair{file.tp, built_in.tp}, std::pair{file.dp, built_in.dp}, std::pair{file.pp, built_in.pp}}) {
    CHECK(a.bandwidth == b.bandwidth);
    CHECK(a.latency == b.latency);
  }
}

TEST_CASE("planner: FSDP holds the shards, the root unit and one block gathered with their gradients") {
  auto const c = sw::models::read_llama_config(data + "/llama3_8b_config.json");
  auto const e = planner::estimate_layout(c, planner::training_shape{8, 1024, planner::bf16_mixed},
                                          planner::layout{8, 1, 1, 1, planner::state_sharding::fsdp}, {});
  std::size_t const block = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096;
  std::size_t const root = 2 * 128256 * 4096 + 4096;  // embedding, output, final norm
  std::size_t const total = 32 * block + root;
  CHECK(e.parameters == total);
  CHECK(e.state_bytes == (total + 7) / 8 * (2 + 2 + 12) + (root + block) * (2 + 2));
}

TEST_CASE("planner: FSDP within pipeline stages holds each stage's shards, its root unit and one block gathered") {
  auto const c = sw::models::read_llama_config(data + "/llama3_8b_config.json");
  planner::training_shape const shape{16, 1024, planner::bf16_mixed};
  std::size_t const block = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096;
  std::size_t const embedding = 128256 * 4096;  // the first stage's root unit
  planner::layout const sharded{4, 2, 1, 4, planner::state_sharding::fsdp};
  auto const e = planner::estimate_layout(c, shape, sharded, {});
  // The busiest stage is the first (two microbatches' activations in flight under 1F1B, the last's one).
  std::size_t const stage = 16 * block + embedding;
  CHECK(e.parameters == stage);
  CHECK(e.state_bytes == (stage + 3) / 4 * (2 + 2 + 12) + (embedding + block) * (2 + 2));
  // Activations and transients are the pipeline's: as replicated pp 2.
  auto const replicated = planner::estimate_layout(c, shape, {4, 2, 1, 4, planner::state_sharding::replicated}, {});
  CHECK(e.activation_bytes == replicated.activation_bytes);
  CHECK(e.working_bytes == replicated.working_bytes);
  CHECK(e.state_bytes < replicated.state_bytes);
  // The root is gathered and reduced once per pipeline step, not per microbatch: 3 of 4 passes fewer than at pp 1.
  planner::machine const m{};
  auto const dp_seconds = [&](std::size_t pp) {
    return planner::detail::data_parallel_seconds(stage, embedding, 0, {4, pp, 1, 4, planner::state_sharding::fsdp},
                                                  planner::bf16_mixed, m);
  };
  double const once = 3.0 / 4.0 * static_cast<double>(embedding);
  CHECK(dp_seconds(1) - dp_seconds(2) == doctest::Approx(3 * once * (2 + 2) / m.dp.bandwidth));
  // The search offers it: some fitting layout of 64 ranks at 24 GiB is FSDP within stages.
  auto const found = planner::search(c, planner::training_shape{64, 4096, planner::bf16_mixed}, 64,
                                     std::size_t{24} << 30, planner::machine{});
  CHECK(std::any_of(found.fitting.begin(), found.fitting.end(), [](planner::estimate const& f) {
    return f.plan.sharding == planner::state_sharding::fsdp && f.plan.pp > 1;
  }));
}

TEST_CASE("planner: the batch's sequence length decides the attention, not the config's") {
  auto const c = sw::models::read_llama_config(data + "/llama3_405b_config.json");  // max_position 131072
  auto shorter = c;
  shorter.sequence = 1024;
  planner::training_shape const shape{64, 1024, planner::bf16_mixed};
  planner::layout const l{8, 2, 8, 4};
  auto const a = planner::estimate_layout(c, shape, l, {});
  auto const b = planner::estimate_layout(shorter, shape, l, {});
  CHECK(a.activation_bytes == b.activation_bytes);
  CHECK(a.step_seconds == b.step_seconds);
  CHECK(thrown([&] {
          (void)planner::estimate_layout(c, planner::training_shape{6, 1024}, l, {});
        }).find("dp x microbatches must divide the batch") != std::string::npos);
}

TEST_CASE("planner: a tp group beyond a node talks over the dp link; fixed axis sizes") {
  auto const c = sw::models::read_llama_config(data + "/llama3_70b_config.json");
  planner::training_shape const shape{64, 4096, planner::bf16_mixed};
  planner::machine node_of_4;
  node_of_4.ranks_per_node = 4;
  node_of_4.dp = {1e9, 1e-4};  // a slow link between nodes
  planner::machine one_node = node_of_4;
  one_node.ranks_per_node = 0;
  auto const step = [&](std::size_t tp, planner::machine const& m) {
    return planner::estimate_layout(c, shape, planner::layout{64 / tp, 1, tp, 1}, m).step_seconds;
  };
  CHECK(step(4, node_of_4) == step(4, one_node));
  CHECK(step(8, node_of_4) > step(8, one_node));
  auto const found = planner::search(c, shape, 256, std::size_t{1} << 50, {}, planner::axis_choice{0, 2, 8});
  REQUIRE_FALSE(found.fitting.empty());
  for (auto const& e : found.fitting) {
    CHECK(e.plan.tp == 8);
    CHECK(e.plan.pp == 2);
  }
}

TEST_CASE("planner and config reader: Llama 3.1 8B, Qwen2.5 7B and SmolLM2 1.7B as published, with their counts") {
  struct published {
    char const* file;
    std::size_t parameters;  // the model card's count
  };
  for (auto const& [file, parameters] :
       {published{"llama3_1_8b_config.json", 8030261248}, published{"qwen2_5_7b_config.json", 7615616512},
        published{"smollm2_1_7b_config.json", 1711376384}, published{"qwen3_8b_config.json", 8190735360}}) {
    INFO(file);
    CHECK(planner::parameter_count(planner::read_model(data + "/" + file)) == parameters);
    auto const c = shardwise::models::read_llama_config(data + "/" + file);  // read to run, not refused
    CHECK(c.sliding_window == 0);
  }
  auto const llama31 = shardwise::models::read_llama_config(data + "/llama3_1_8b_config.json");
  CHECK(llama31.rope_scaling.type == shardwise::models::rope_type::llama3);
  CHECK(llama31.sequence == 131072);
  CHECK(shardwise::models::read_llama_config(data + "/smollm2_1_7b_config.json").tie_word_embeddings);
  CHECK(shardwise::models::read_llama_config(data + "/qwen2_5_7b_config.json").attention_bias);
  auto const qwen3 = shardwise::models::read_llama_config(data + "/qwen3_8b_config.json");
  CHECK((qwen3.qk_norm && qwen3.head_dim() == 128 && qwen3.explicit_head_dim == 0));  // 32 heads of 128 on 4096
  CHECK(planner::read_model(data + "/qwen3_8b_config.json").family == "Qwen3");
}

TEST_CASE("planner: Qwen2 (q/k/v biases), Mistral (a sliding window) and GPT-2 configs, with their parameter counts") {
  auto const qwen2 = planner::read_model(data + "/qwen2_7b_config.json");
  CHECK(qwen2.family == "Qwen2");
  CHECK(qwen2.qkv_bias);
  CHECK(qwen2.sliding_window == 0);  // "use_sliding_window": false
  std::size_t const qwen2_biases = 28 * (3584 + 2 * 4 * 128);
  CHECK(planner::parameter_count(qwen2) == llama_parameters(152064, 3584, 28, 28, 4, 18944) + qwen2_biases);

  auto const mistral = planner::read_model(data + "/mistral_7b_config.json");
  CHECK(mistral.family == "Mistral");
  CHECK(mistral.sliding_window == 4096);
  CHECK_FALSE(mistral.qkv_bias);
  CHECK(planner::parameter_count(mistral) == 7241732096);  // Mistral 7B's published count
  CHECK(planner::parameter_count(mistral) == llama_parameters(32000, 4096, 32, 32, 8, 14336));

  auto const gpt2 = planner::read_model(data + "/gpt2_config.json");
  CHECK(gpt2.family == "GPT-2");
  CHECK_FALSE(gpt2.pipeline);
  // GPT-2 small's 124,439,808: per block two LayerNorms, c_attn, c_proj, c_fc and c_proj with biases; wte, wpe,
  // ln_f; the LM head is wte.
  std::size_t const block = 2 * 2 * 768 + (768 * 2304 + 2304) + (768 * 768 + 768) + 2 * (768 * 3072) + 3072 + 768;
  CHECK(planner::parameter_count(gpt2) == 12 * block + 50257 * 768 + 1024 * 768 + 2 * 768);
  CHECK(planner::parameter_count(gpt2) == 124439808);
  auto const found = planner::search(gpt2, {64, 1024, planner::bf16_mixed}, 8, std::size_t{1} << 40, {});
  REQUIRE_FALSE(found.fitting.empty());
  for (auto const& e : found.fitting) CHECK(e.plan.pp == 1);  // shardwise runs GPT-2 without stages
}

TEST_CASE("planner: a sliding window bounds the attention's work; within the window nothing changes") {
  auto const mistral = planner::read_model(data + "/mistral_7b_config.json");
  auto whole = mistral;  // the same block without the window
  whole.sliding_window = 0;
  planner::layout const l{4, 1, 8, 2, planner::state_sharding::zero1};
  auto const at = [&](planner::model_description const& d, std::size_t sequence) {
    return planner::estimate_layout(d, planner::training_shape{64, sequence, planner::bf16_mixed}, l, {});
  };
  CHECK(at(mistral, 4096).step_seconds == at(whole, 4096).step_seconds);
  CHECK(at(mistral, 4096).bytes_per_rank() == at(whole, 4096).bytes_per_rank());
  CHECK(at(mistral, 32768).step_seconds < at(whole, 32768).step_seconds);
  // The window bounds the backward's panels, but its peak is later, once they are freed: the attention's three
  // input gradients (tokens x dim each) outweigh two panels of 128 rows x 32768 keys.
  CHECK(at(mistral, 32768).working_bytes == at(whole, 32768).working_bytes);
  CHECK(at(mistral, 32768).activation_bytes == at(whole, 32768).activation_bytes);  // saved per token either way
  // The keys a query meets: all earlier ones up to the window, a panel of 128 rows at a time. 7/8 of the queries
  // meet the window and up to a panel more; the first 4096 about half of it: between 7/8 x 4096 + 1/8 x 2048 - 128
  // and 4096 + 128.
  CHECK(planner::detail::attention_keys_met(32768, 4096) < 4096 + 128);
  CHECK(planner::detail::attention_keys_met(32768, 4096) > 3584 + 256 - 128);
  CHECK(planner::detail::attention_keys_met(2048, 4096) == sw::nn::attention_keys_per_query(2048));
}

TEST_CASE("planner: a config of another model_type, or a bad sliding window, is refused naming it") {
  auto const refused = [](std::string const& text) {
    return thrown([&] { (void)planner::model_from_json(text, "c.json"); });
  };
  CHECK(refused(R"({"model_type": "t5"})")
            .find("c.json describes model_type \"t5\"; the planner plans llama, qwen2, qwen3, "
                  "mistral and gpt2") != std::string::npos);
  CHECK(refused("{}").find("describes model_type (none)") != std::string::npos);
  std::string const mistral = R"({"model_type": "mistral", "vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "sliding_window": )";
  CHECK(refused(mistral + "-3}").find("\"sliding_window\" in c.json is -3; it must be a positive whole number") !=
        std::string::npos);
  CHECK(planner::model_from_json(mistral + "null}", "c.json").sliding_window == 0);  // Mistral v0.3: no window
  // Qwen2 windows the layers from max_window_layers on: all of them at 0, else the planner plans full attention.
  std::string const qwen2 = R"({"model_type": "qwen2", "vocab_size": 32, "hidden_size": 64, "num_hidden_layers": 2,
    "num_attention_heads": 4, "intermediate_size": 128, "sliding_window": 16, "use_sliding_window": true, )";
  CHECK(planner::model_from_json(qwen2 + R"("max_window_layers": 0})", "c.json").sliding_window == 16);
  CHECK(planner::model_from_json(qwen2 + R"("max_window_layers": 1})", "c.json").sliding_window == 0);
  CHECK(planner::model_from_json(qwen2 + R"("max_window_layers": 0, "use_sliding_window": false})", "c.json")
            .sliding_window == 0);
}

TEST_CASE(
    "planner: cp cuts each sequence: activations near 1/cp, the ring on the cp link; searched with pipelines and "
    "FSDP") {
  auto const c = sw::models::read_llama_config(data + "/llama3_8b_config.json");
  planner::training_shape const shape{8, 32768, planner::bf16_mixed};
  planner::layout const whole{1, 1, 8, 1};
  planner::layout cut = whole;
  cut.cp = 2;
  auto const a = planner::estimate_layout(c, shape, whole, {});
  auto const b = planner::estimate_layout(c, shape, cut, {});
  CHECK(b.state_bytes == a.state_bytes);  // the same parameters on every cp rank
  // Half the tokens per rank; the ring keeps the attention's output too (one more activation of q's size).
  double const ratio = static_cast<double>(b.activation_bytes) / static_cast<double>(a.activation_bytes);
  CAPTURE(ratio);
  CHECK(ratio > 0.5);
  CHECK(ratio < 0.6);
  CHECK(b.tokens_per_second > 1.5 * a.tokens_per_second);  // twice the ranks, each with half the sequence
  planner::machine slow_ring;
  slow_ring.tp = {1e8, 1e-3};  // the ring's neighbours share the node's (tp) link
  CHECK(planner::estimate_layout(c, shape, cut, slow_ring).step_seconds > b.step_seconds);
  // A search at 16 ranks, in less memory than tp 8 alone needs: layouts with cp fit, with pipeline stages and
  // under FSDP among them; at pp 1 and tp 8 only cut sequences fit.
  std::size_t const limit = a.bytes_per_rank() * 3 / 4;
  auto const found = planner::search(c, shape, 16, limit, {});
  REQUIRE_FALSE(found.fitting.empty());
  std::size_t cut_layouts = 0, cut_pipelines = 0, cut_under_fsdp = 0;
  for (auto const& e : found.fitting) {
    CHECK(e.plan.dp * e.plan.pp * e.plan.tp * e.plan.cp == 16);
    if (e.plan.cp == 1) continue;
    ++cut_layouts;
    cut_pipelines += e.plan.pp > 1 ? 1 : 0;
    cut_under_fsdp += e.plan.sharding == planner::state_sharding::fsdp ? 1 : 0;
  }
  CHECK(cut_layouts > 0);
  CHECK(cut_pipelines > 0);
  CHECK(cut_under_fsdp > 0);
  planner::training_shape const one_sequence{1, 32768, planner::bf16_mixed};  // dp cannot cut a batch of one
  auto const at_tp8 = planner::search(c, one_sequence, 16, a.bytes_per_rank() * 3 / 8, {}, {0, 1, 8});
  REQUIRE_FALSE(at_tp8.fitting.empty());
  for (auto const& e : at_tp8.fitting) CHECK(e.plan.cp == 2);
  CHECK(at_tp8.smallest.plan.cp == 2);
  auto const fixed = planner::search(c, shape, 16, std::size_t{1} << 50, {}, planner::axis_choice{0, 0, 0, 4});
  REQUIRE_FALSE(fixed.fitting.empty());
  for (auto const& e : fixed.fitting) CHECK(e.plan.cp == 4);
  planner::layout too_many = whole;
  too_many.cp = 16;
  CHECK(thrown([&] { (void)planner::estimate_layout(c, shape, too_many, {}); }).find("cp be at most 8") !=
        std::string::npos);
  // GPT-2 is cut over cp too (wpe at global positions): its activations near half at cp 2; a model that does not
  // say it can be cut is refused by name.
  auto const gpt2 = planner::read_model(data + "/gpt2_config.json");
  planner::training_shape const short_shape{64, 1024, planner::bf16_mixed};
  auto const gpt2_whole = planner::estimate_layout(gpt2, short_shape, planner::layout{1, 1, 4, 1}, {});
  auto const gpt2_cut = planner::estimate_layout(gpt2, short_shape, planner::layout{1, 1, 4, 1, {}, false, 2}, {});
  double const gpt2_ratio =
      static_cast<double>(gpt2_cut.activation_bytes) / static_cast<double>(gpt2_whole.activation_bytes);
  CAPTURE(gpt2_ratio);
  CHECK(gpt2_ratio > 0.5);
  CHECK(gpt2_ratio < 0.6);
  auto uncut = gpt2;
  uncut.context_parallel = false;
  for (auto const& e : planner::search(uncut, short_shape, 8, std::size_t{1} << 50, {}).fitting) CHECK(e.plan.cp == 1);
  CHECK(thrown([&] {
          (void)planner::estimate_layout(uncut, short_shape, planner::layout{1, 1, 4, 1, {}, false, 2}, {});
        }).find("cp > 1 needs a model shardwise cuts over cp (the Llama family and GPT-2)") != std::string::npos);
}

TEST_CASE("planner: ZB-H1 and ZBV take 1F1B's step times their tables' timeline, and hold pp on every stage") {
  // With F = B = W, ZB-H1's pipeline time is 3m + p - 1 against 1F1B's 3(m + p - 1), once m >= p; past 4 p
  // microbatches the ratio comes from the steady state, one microbatch's work per microbatch.
  planner::microbatch_parts const unit{1, 1, 1};
  for (std::size_t m : {4, 8, 16, 64, 1000})
    CHECK(planner::schedule_time_ratio(planner::pipeline_choice::zero_bubble_h1, 4, m, unit) ==
          doctest::Approx(double(3 * m + 3) / double(3 * (m + 3))).epsilon(1e-12));
  CHECK(planner::schedule_time_ratio(planner::pipeline_choice::zero_bubble_v, 4, 64, unit) ==
        doctest::Approx((3 * 64 + 1.5) / (3 * 67.0)).epsilon(1e-12));  // ZBV: 3m + (p - 1) / 2
  CHECK(planner::schedule_time_ratio(planner::pipeline_choice::one_f_one_b, 4, 8, unit) == 1);
  auto const c = sw::models::read_llama_config(data + "/llama3_8b_config.json");
  planner::training_shape const shape{64, 8192, planner::bf16_mixed};
  planner::machine const m;
  auto const at = [&](planner::pipeline_choice s, std::size_t pp, std::size_t micro) {
    return planner::estimate_layout(c, shape, planner::layout{1, pp, 8, micro, {}, false, 1, s}, m);
  };
  auto const one = at(planner::pipeline_choice::one_f_one_b, 4, 4);
  auto const h1 = at(planner::pipeline_choice::zero_bubble_h1, 4, 4);
  auto const v = at(planner::pipeline_choice::zero_bubble_v, 4, 4);
  CHECK(h1.step_seconds < one.step_seconds);
  CHECK(v.step_seconds < h1.step_seconds);
  CHECK(h1.activation_bytes >= one.activation_bytes);  // the last stage holds pp microbatches too, and the head
  CHECK(v.state_bytes > one.state_bytes);              // rank 0 holds the embedding and the output
  CHECK_THROWS_WITH_AS(at(planner::pipeline_choice::zero_bubble_v, 3, 4),
                       doctest::Contains("ZeroBubbleV over 3 stages cuts the 32 layers into 6 chunks"), sw::error);
  planner::axis_choice only;
  only.pp = 4, only.schedule = planner::pipeline_choice::zero_bubble_h1;
  auto const found = planner::search(c, shape, 32, std::size_t(80) << 30, m, only);
  REQUIRE_FALSE(found.fitting.empty());
  for (auto const& e : found.fitting) CHECK(e.plan.schedule == planner::pipeline_choice::zero_bubble_h1);
}

TEST_CASE("planner calibration: a curve fitted exactly, a machine measured, written whole and read back") {
  // rate = 100 t / (t + 20) at three token counts: the fit gives back the peak and the half-rate tokens.
  std::vector<std::pair<double, double>> curve;
  for (double t : {10.0, 40.0, 160.0}) curve.emplace_back(t, 100 * t / (t + 20));
  auto const [peak, half] = planner::fit_gemm_curve(curve);
  CHECK(peak == doctest::Approx(100).epsilon(1e-12));
  CHECK(half == doctest::Approx(20).epsilon(1e-12));
  // A rate that does not fall with fewer tokens: the best rate, flat.
  auto const flat = planner::fit_gemm_curve({{10.0, 90.0}, {40.0, 80.0}});
  CHECK(flat.first == 90.0);
  CHECK(flat.second == 0.0);

  // Measured briefly here: every rate within the machine file's ranges, and the JSON read back as it was.
  auto const folder = std::filesystem::temp_directory_path() / ("shardwise_calibration_" + std::to_string(::getpid()));
  std::filesystem::remove_all(folder);
  planner::calibration const quick{1, {16, 64}};
  planner::machine const measured = planner::calibrated_machine(folder, quick);
  CHECK(measured.gemm_flops > 1e6);
  CHECK(measured.memory_bandwidth > 1e6);
  for (auto const& l : {measured.tp, measured.dp, measured.pp}) {
    CHECK(l.bandwidth > 1e3);
    CHECK(l.latency > 0);
  }
  CHECK(measured.name.find("calibrated by shardwise") != std::string::npos);
  auto const file = planner::calibration_file(folder);
  REQUIRE(std::filesystem::is_regular_file(file));
  CHECK(std::distance(std::filesystem::directory_iterator(folder), std::filesystem::directory_iterator()) == 1);
  auto const again = planner::read_machine(file);
  CHECK(again.gemm_flops == doctest::Approx(measured.gemm_flops).epsilon(1e-3));
  CHECK(again.tp.latency == doctest::Approx(measured.tp.latency).epsilon(1e-3));
  CHECK(again.measured == measured.measured);
  // The next call reads the file rather than measuring: an edited rate comes back.
  {
    std::ofstream edit(file, std::ios::trunc);
    edit << planner::machine_json([&] {
      auto m = measured;
      m.gemm_flops = 12345e6;
      return m;
    }());
  }
  CHECK(planner::calibrated_machine(folder, quick).gemm_flops == doctest::Approx(12345e6));
  CHECK(planner::calibrated_machine(folder, quick, true).gemm_flops != doctest::Approx(12345e6));  // measured afresh
  std::filesystem::remove_all(folder);
}
