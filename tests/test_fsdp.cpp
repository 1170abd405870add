// FSDP on the thread mesh: 50 steps of the Llama model under sw::fully_shard, loss curve, every step's global
// norm (clipped on every step) and final parameters equal to the unsharded run (losses and norms 1e-4 relative,
// parameters as llama_cases::check_same_run states), for full shard at dp 2 and 4, shard-grad-op, no-shard,
// hybrid 2 x 2, FSDP dp 2 x TP 2 with sequence parallelism, wrap by path, by type, by size and none,
// activation checkpointing, uneven shards (dp 3, dp 4 and dp 2 x tp 2 on sizes they do not divide), and
// forward and backward prefetch; a MoeLlama at dp 1, 2 and 4, its experts sharded with the rest.
#include <doctest/doctest.h>

#include "cases/fsdp_cases.hpp"
#include "support/worlds.hpp"

namespace {
namespace sw = shardwise;
using namespace fsdp_cases;
int const steps = llama_cases::steps();

template <class Policy, class Plan = sw::serial_plan>
void check(char const* name, int ranks, Setup const& setup, shardwise::models::LlamaConfig const& c,
           llama_cases::Run const& serial, Tolerance tolerance = {}) {
  INFO(std::string(name));
  worlds::run_threads(ranks, [&](auto& world) {
    auto const run = fsdp_cases::train<Policy, Plan>(world, setup, c, steps);
    if (world.rank() == 0) fsdp_cases::check_same_training(run, serial, tolerance);
  });
}

/// The words `shard` raised on this rank ("(no error)" if none), checked to be the same on every rank of dp.
template <class Mesh, class Shard>
std::string refusal_on_every_rank(Mesh const& dp, Shard&& shard) {
  std::string message = "(no error)";
  try {
    shard();
  } catch (sw::error const& e) {
    message = e.what();
  }
  CAPTURE(message);
  auto const text_hash = static_cast<double>(std::hash<std::string>{}(message) >> 12);
  CHECK(sw::all_reduce(dp, text_hash, sw::Max{}) == sw::all_reduce(dp, text_hash, sw::Min{}));
  return message;
}
}  // namespace

TEST_CASE("FSDP strategies equal the unsharded run, thread mesh") {
  auto const c = llama_cases::small_config();
  auto const serial = serial_run(c, steps);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("full shard, dp 2", 2, {.dp = 2}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("full shard, dp 4", 4, {.dp = 4}, c, serial);
  check<sw::fsdp_policy<sw::shard_grad_op, blocks>>("shard-grad-op, dp 2", 2, {.dp = 2}, c, serial);
  check<sw::fsdp_policy<sw::no_shard, blocks>>("no-shard, dp 2", 2, {.dp = 2}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("hybrid, 2 x 2", 4, {.dp = 2, .replicate = 2}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>, sequence_parallel>("FSDP dp 2 x TP 2 (SP)", 4, {.dp = 2}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>, sequence_parallel>("FSDP x TP from the dp x tp mesh", 4,
                                                                    {.dp = 2, .one_mesh = true}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("activation checkpointing", 2, {.dp = 2, .checkpoint_blocks = true}, c,
                                                 serial);
}

TEST_CASE("FSDP wrap policies: the units they make, and training equal to the unsharded run") {
  auto const c = llama_cases::small_config();
  auto const serial = serial_run(c, steps);
  using block = sw::models::Llama<float>::block_type;
  check<sw::fsdp_policy<sw::full_shard, sw::wrap_type<block>>>("wrap by type", 2, {.dp = 2}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, sw::wrap_none>>("no wrap", 2, {.dp = 2}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, sw::wrap_min_params>>("wrap by size", 2, {.dp = 2, .min_num_params = 3000}, c,
                                                              serial);

  worlds::run_threads(2, [&](auto& world) {
    auto const dp = sw::make_mesh<"dp">(world, {2});
    auto units = [&]<class Wrap>(std::size_t min_params) {
      sw::models::Llama<float> model(c);
      auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, Wrap>>(model, dp, {.min_num_params = min_params});
      return std::pair{sharded.unit_paths(), sharded.unit_parameters(0)};
    };
    using list = std::vector<std::string>;
    CHECK(units.template operator()<blocks>(0).first == list{"", "layers.0", "layers.1"});
    CHECK(units.template operator()<sw::wrap_type<block>>(0).first == list{"", "layers.0", "layers.1"});
    CHECK(units.template operator()<sw::wrap_none>(0).first == list{""});
    // The root holds what no block holds: the embedding, the final norm and the output.
    CHECK(units.template operator()<blocks>(0).second == list{"tok_embeddings.weight", "norm.weight", "output.weight"});
    // By size, children first: attention 4 x 32 x 32 = 4096 and feed-forward 3 x 32 x 64 = 6144 parameters each
    // reach 3000; a block's norms (64) then do not, nor the rest of the model.
    CHECK(units.template operator()<sw::wrap_min_params>(3000).first ==
          list{"", "layers.1.feed_forward", "layers.1.attention", "layers.0.feed_forward", "layers.0.attention"});
    // At 5000 only the feed-forwards do; then each block with its attention and norms (4160) does not either.
    CHECK(units.template operator()<sw::wrap_min_params>(5000).first ==
          list{"", "layers.1.feed_forward", "layers.0.feed_forward"});
  });
}

TEST_CASE("FSDP ranks that shard different models, or by other wrap policies, are refused by name on every rank") {
  auto const c = llama_cases::small_config();
  for (int n : {2, 3, 4}) {
    CAPTURE(n);
    worlds::run_threads(n, [&](auto& world) {
      auto const dp = sw::make_mesh<"dp">(world, {n});
      auto const refused = [&](auto&& shard, std::vector<std::string> const& parts) {
        std::string const message = refusal_on_every_rank(dp, shard);
        CAPTURE(message);
        CHECK(message.find("shardwise::fully_shard: the ranks of mesh axis \"dp\" shard different models: rank 0 "
                           "has ") == 0);
        for (auto const& part : parts) CHECK_MESSAGE(message.find(part) != std::string::npos, part);
      };
      auto other = c;
      other.layers = dp.rank() == n - 1 ? c.layers + 1 : c.layers;  // the last rank's model has a block more
      refused(
          [&] {
            sw::models::Llama<float> model(other);
            (void)sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, dp);
          },
          {" in 3 units (", "rank " + std::to_string(n - 1) + " has ", " in 4 units (",
           "the same wrap policy on every rank"});
      refused(
          [&] {  // the same model, wrapped by block on rank 0 and not at all elsewhere
            sw::models::Llama<float> model(c);
            if (dp.rank() == 0)
              (void)sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, dp);
            else
              (void)sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_none>>(model, dp);
          },
          {" in 3 units (", " in 1 units ("});
    });
  }
}

TEST_CASE("FSDP ranks that shard by different strategies are refused at fully_shard, naming each rank's") {
  auto const c = llama_cases::small_config();
  for (int n : {2, 3}) {
    CAPTURE(n);
    worlds::run_threads(n, [&](auto& world) {
      auto const dp = sw::make_mesh<"dp">(world, {n});
      auto const refused = [&](auto&& shard, std::string const& expected) {
        CHECK(refusal_on_every_rank(dp, shard) == expected);
      };
      std::string const fix = ". Give every rank the same fsdp_policy strategy (full_shard, shard_grad_op or no_shard)";
      std::string const start = "shardwise::fully_shard: the ranks of mesh axis \"dp\" shard by different strategies: ";
      std::string const rest = n == 3 ? "; rank 2 has full_shard" : "";
      refused(
          [&] {  // no_shard on rank 1: all-reduces where the others reduce-scatter
            sw::models::Llama<float> model(c);
            if (dp.rank() == 1)
              (void)sw::fully_shard<sw::fsdp_policy<sw::no_shard, blocks>>(model, dp);
            else
              (void)sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, dp);
          },
          start + "rank 0 has full_shard; rank 1 has no_shard" + rest + fix);
      refused(
          [&] {  // shard_grad_op on rank 0: gathers once a step where the others gather twice
            sw::models::Llama<float> model(c);
            if (dp.rank() == 0)
              (void)sw::fully_shard<sw::fsdp_policy<sw::shard_grad_op, blocks>>(model, dp);
            else
              (void)sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, dp);
          },
          start + "rank 0 has shard_grad_op; rank 1 has full_shard" + rest + fix);
    });
  }
}

TEST_CASE("FSDP sync_module_states: ranks built from other seeds start from rank 0's parameters") {
  auto const c = llama_cases::small_config();
  auto const serial = serial_run(c, steps);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("dp 2", 2, {.dp = 2, .sync_module_states = true}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("hybrid 2 x 2", 4,
                                                 {.dp = 2, .replicate = 2, .sync_module_states = true}, c, serial);
  // Without it the same ranks train another model: the first loss already differs.
  worlds::run_threads(2, [&](auto& world) {
    auto const dp = sw::make_mesh<"dp">(world, {2});
    auto own = c;
    own.seed += static_cast<std::uint64_t>(dp.rank());
    sw::models::Llama<float> model(own);
    auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, dp);
    std::vector<std::int64_t> ids, targets;
    llama_cases::batch(c, 0, 4, 2 * dp.rank(), 2, ids, targets);
    auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
    float const loss =
        sw::all_reduce(dp, sw::models::llama_loss(tp, sharded.forward(ids), targets, c.vocabulary).loss, sw::Avg{});
    if (world.rank() == 0) CHECK(std::abs(loss - serial.losses.front()) > 1e-3 * serial.losses.front());
  });
}

TEST_CASE("FSDP: gradient accumulation, a forward without backward, tied embeddings, repeated key-value heads") {
  auto const c = llama_cases::small_config();
  auto const serial = serial_run(c, steps);
  // A validation forward between the backward and the step leaves units gathered; the step's new values must
  // reach the next forward all the same.
  check<sw::fsdp_policy<sw::shard_grad_op, blocks>>("forward without backward, shard-grad-op", 2,
                                                    {.dp = 2, .validation_forward = true}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("forward without backward, full shard", 2,
                                                 {.dp = 2, .validation_forward = true}, c, serial);
  check<sw::fsdp_policy<sw::no_shard, blocks, sw::mixed_precision<Eigen::bfloat16, float>>>(
      "forward without backward, no-shard in bf16", 2, {.dp = 2, .validation_forward = true}, c,
      bf16_reference(c, steps, 2, false), bf16_rounding);
  auto const two_microbatches = serial_run(c, steps, 4, 2);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("two microbatches per step", 2, {.dp = 2, .microbatches = 2}, c,
                                                 two_microbatches);
  // FSDP2's no-sync accumulation: whole gradients kept over the first microbatch, reduced after the last.
  check<sw::fsdp_policy<sw::full_shard, blocks>>("two microbatches, reduced after the last", 2,
                                                 {.dp = 2, .microbatches = 2, .sync_last_microbatch = true}, c,
                                                 two_microbatches);
  check<sw::fsdp_policy<sw::full_shard, blocks>, sequence_parallel>(
      "two microbatches, reduced after the last, dp 2 x TP 2 (SP)", 4,
      {.dp = 2, .microbatches = 2, .sync_last_microbatch = true}, c, two_microbatches);
  auto tied = c;
  tied.tie_word_embeddings = true;
  auto const tied_serial = serial_run(tied, steps);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("tied embeddings, dp 2", 2, {.dp = 2}, tied, tied_serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>, sequence_parallel>("tied embeddings, dp 2 x TP 2", 4, {.dp = 2}, tied,
                                                                    tied_serial);
  auto qwen2 = tied;  // Qwen2's biases on q, k and v, and a yarn rotary scaling: each bias a unit's slot like a weight
  qwen2.attention_bias = true;
  qwen2.rope_scaling = {.type = models::rope_type::yarn, .factor = 4, .original_max_positions = 64};
  auto const qwen2_serial = serial_run(qwen2, steps);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("Qwen2 (biases, yarn), dp 2", 2, {.dp = 2}, qwen2, qwen2_serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>, sequence_parallel>("Qwen2 (biases, yarn), dp 2 x TP 2", 4, {.dp = 2},
                                                                    qwen2, qwen2_serial);
  auto one_kv_head = c;
  one_kv_head.kv_heads = 1;  // repeated over the 2 tp ranks (kv_size_multiplier)
  check<sw::fsdp_policy<sw::full_shard, blocks>, sequence_parallel>("1 key-value head, dp 2 x TP 2", 4, {.dp = 2},
                                                                    one_kv_head, serial_run(one_kv_head, steps));
}

TEST_CASE("FSDP with uneven shards equals the unsharded run") {
  auto const c = uneven_config();
  auto const serial = serial_run(c, steps, 12);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("full shard, dp 3", 3, {.dp = 3, .sequences = 12}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("full shard, dp 4", 4, {.dp = 4, .sequences = 12}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>, tp_only>("dp 2 x TP 2", 4, {.dp = 2, .sequences = 12}, c, serial);
  // Tied embeddings with a vocabulary of 67, which no dp size here divides: each rank's rows of the one shared
  // table, its last shard short (FSDP2 skipped such a shard's gradient for a tied weight: PyTorch #176076).
  auto tied = c;
  tied.tie_word_embeddings = true;
  auto const tied_serial = serial_run(tied, steps, 12);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("tied, vocabulary 67, dp 2", 2, {.dp = 2, .sequences = 12}, tied,
                                                 tied_serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("tied, vocabulary 67, dp 4", 4, {.dp = 4, .sequences = 12}, tied,
                                                 tied_serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>, tp_only>("tied, vocabulary 67, dp 2 x TP 2", 4,
                                                          {.dp = 2, .sequences = 12}, tied, tied_serial);
}

TEST_CASE("FSDP holds each rank's shard: parameters and gradients over dp") {
  auto const c = llama_cases::small_config();
  std::size_t total = 0;
  {
    sw::models::Llama<float> model(c);
    sw::for_each_parameter(model, [&](std::string const&, auto const& p) { total += std::size_t(p.value->size()); });
  }
  for (int dp : {1, 2, 4}) {
    std::vector<std::size_t> held(static_cast<std::size_t>(dp));
    worlds::run_threads(dp, [&](auto& world) {
      sw::models::Llama<float> model(c);
      auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, sw::make_mesh<"dp">(world, {dp}));
      held[std::size_t(world.rank())] = sharded.held_elements();
      std::size_t left = 0;  // what the model itself still holds between steps: nothing
      sw::for_each_parameter(model, [&](std::string const&, auto const& p) { left += std::size_t(p.value->size()); });
      CHECK(left == 0);
    });
    std::size_t sum = 0;
    for (auto h : held) {
      CHECK(h == 2 * total / std::size_t(dp));  // every size here divides by 1, 2 and 4
      sum += h;
    }
    CHECK(sum == 2 * total);  // values and gradients, each element on exactly one rank
  }
}

TEST_CASE("FSDP full shard: units reuse the storage the unit before them released; between steps only the root's") {
  auto c = llama_cases::small_config();
  c.layers = 3;
  std::size_t block_matrix_bytes = 0;  // one block's whole matrices: what a unit gathers, and its full gradients
  std::size_t root_matrix_bytes = 0;   // the root unit's: the embedding and the output projection
  {
    sw::models::Llama<float> model(c);
    sw::for_each_parameter(model, [&](std::string const& name, auto const& p) {
      if (p.value->rows() == 1 || p.value->cols() == 1) return;  // vectors: small, from the heap
      std::size_t const bytes = std::size_t(p.value->size()) * sizeof(float);
      if (name.starts_with("layers.0.")) block_matrix_bytes += bytes;
      if (!name.starts_with("layers.")) root_matrix_bytes += bytes;
    });
  }
  REQUIRE(block_matrix_bytes > 0);
  REQUIRE(root_matrix_bytes > 0);
  worlds::run_threads(2, [&](auto& world) {
    sw::models::Llama<float> model(c);
    auto const dp = sw::make_mesh<"dp">(world, {2});
    auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, blocks>>(model, dp);
    sw::AdamW<float> optimizer({.learning_rate = 1e-3f});
    std::vector<std::int64_t> ids(8), targets(8);
    for (std::size_t i = 0; i < ids.size(); ++i)
      ids[i] = std::int64_t(i * 5 % c.vocabulary), targets[i] = (ids[i] + 1) % std::int64_t(c.vocabulary);
    CHECK(sharded.kept_bytes() == 0);
    for (int step = 0; step < 2; ++step) {
      auto const logits = sharded.forward(ids);
      CHECK(sharded.kept_bytes() == block_matrix_bytes);  // the last block's parameters, for the backward's first
      auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
      sharded.backward(sw::models::llama_loss(tp, logits, targets, c.vocabulary).dlogits);
      optimizer.step(sharded);
      sw::zero_grad(sharded);
      // Forward: blocks 1 and 2 take the parameters of the block before (and from the second step on, the root
      // the root's); backward: block 2 takes the parameters block 2 released in forward, blocks 1 and 0 the
      // parameters and the gradients of the block after (block 2 allocates its gradients).
      std::size_t const root = step == 0 ? 0 : root_matrix_bytes;
      CHECK(sharded.reused_bytes() == 2 * block_matrix_bytes + block_matrix_bytes + 2 * 2 * block_matrix_bytes + root);
      CHECK(sharded.kept_bytes() == root_matrix_bytes);  // the root's parameters, for the next forward's first gather
      std::size_t left = 0;                              // between steps the model holds no whole tensor, kept or not
      sw::for_each_parameter(model, [&](std::string const&, auto const& p) {
        left += std::size_t(p.value->size()) + std::size_t(p.grad->size());
      });
      CHECK(left == 0);
    }
    sharded.reshard();
    CHECK(sharded.kept_bytes() == 0);
  });
}

TEST_CASE("FSDP with forward and backward prefetch equals the unsharded run") {
  auto const c = llama_cases::small_config();
  auto const serial = serial_run(c, steps);
  check<sw::fsdp_policy<sw::full_shard, blocks>>("prefetch, dp 2", 2, {.dp = 2, .prefetch = true}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>, sequence_parallel>("prefetch, dp 2 x TP 2", 4,
                                                                    {.dp = 2, .prefetch = true}, c, serial);
  check<sw::fsdp_policy<sw::full_shard, blocks>>(
      "prefetch, activation checkpointing, a forward without backward", 2,
      {.dp = 2, .checkpoint_blocks = true, .validation_forward = true, .prefetch = true}, c, serial);
  using bf16 = Eigen::bfloat16;
  check<sw::fsdp_policy<sw::full_shard, blocks, sw::mixed_precision<bf16, float>>>(
      "prefetch, bf16 gathers", 2, {.dp = 2, .prefetch = true}, c, bf16_reference(c, steps, 2, false), bf16_rounding);
}

TEST_CASE("FSDP mixed precision equals the unsharded run that rounds the same way") {
  auto const c = llama_cases::small_config();
  using bf16 = Eigen::bfloat16;
  auto const gathers_bf16 = bf16_reference(c, steps, 2, false);
  check<sw::fsdp_policy<sw::full_shard, blocks, sw::mixed_precision<bf16, float>>>("bf16 gathers, dp 2", 2, {.dp = 2},
                                                                                   c, gathers_bf16, bf16_rounding);
  check<sw::fsdp_policy<sw::full_shard, blocks, sw::mixed_precision<bf16, float>>, sequence_parallel>(
      "bf16 gathers, dp 2 x TP 2", 4, {.dp = 2}, c, gathers_bf16, bf16_rounding);
  check<sw::fsdp_policy<sw::no_shard, blocks, sw::mixed_precision<bf16, float>>>("bf16 gathers, no-shard", 2, {.dp = 2},
                                                                                 c, gathers_bf16, bf16_rounding);
  auto const reduces_bf16 = bf16_reference(c, steps, 2, true);
  check<sw::fsdp_policy<sw::full_shard, blocks, sw::mixed_precision<bf16, bf16>>>(
      "bf16 gathers and reduce, dp 2", 2, {.dp = 2}, c, reduces_bf16, bf16_rounding);
}

TEST_CASE("FSDP of a MoeLlama, its experts sharded with the rest, equals the unsharded run at dp 1, 2 and 4") {
  for (int ranks : {1, 2, 4}) sw::run_threads(ranks, [](auto& world) { check_moe_llama(world); });
}

TEST_CASE("FSDP of a MoeLlama with its experts over ep drawn from dp, each expert sharded over its replicas") {
  for (int ranks : {1, 2, 4})
    for (int ep : {1, 2, 4})
      if (ep <= ranks) sw::run_threads(ranks, [&](auto& world) { check_moe_llama_placed(world, ep); });
}
