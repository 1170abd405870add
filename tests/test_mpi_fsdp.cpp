// FSDP on the MPI mesh (CTest runs this under mpiexec -n 1, 2 and 4), against the unsharded run computed on
// every rank (cases/fsdp_cases.hpp): at 1 rank full shard; at 2 every strategy, wrap by type and by size,
// activation checkpointing and uneven shards; at 4 full shard, hybrid 2 x 2, FSDP dp 2 x TP 2 with sequence
// parallelism, and uneven shards at dp 4 and dp 2 x tp 2. Mixed precision (bfloat16 gathers, fp32 or bfloat16
// reduce) against the unsharded run that rounds the same way: at 1, at 2, and at dp 2 x tp 2. Forward and
// backward prefetch (MPI_Iallgatherv started before a unit computes): at 2 (uneven shards, activation
// checkpointing, bf16 gathers) and at 4 (hybrid, dp 2 x TP 2). A MoeLlama, its experts sharded with the rest.
// Processes given different strategies are refused at fully_shard, naming each one's.
#include <doctest/doctest.h>

#include "cases/fsdp_cases.hpp"
#include "support/worlds.hpp"

namespace {
namespace sw = shardwise;
using namespace fsdp_cases;
template <class Strategy, class Wrap = blocks>
using policy = sw::fsdp_policy<Strategy, Wrap>;
}  // namespace

TEST_CASE("FSDP equals the unsharded run, MPI mesh") {
  int const steps = llama_cases::steps();
  auto const world = worlds::mpi();
  auto const c = llama_cases::small_config();
  auto const serial = serial_run(c, steps);
  auto const uneven = uneven_config();
  auto const uneven_serial = serial_run(uneven, steps, 12);
  using block = sw::models::Llama<float>::block_type;
  if (world.size() == 1) {
    check_same_training(train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 1}, c, steps), serial);
  } else if (world.size() == 2) {
    check_same_training(train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 2}, c, steps), serial);
    check_same_training(train<policy<sw::shard_grad_op>, sw::serial_plan>(world, {.dp = 2}, c, steps), serial);
    check_same_training(train<policy<sw::no_shard>, sw::serial_plan>(world, {.dp = 2}, c, steps), serial);
    check_same_training(
        train<policy<sw::full_shard, sw::wrap_type<block>>, sw::serial_plan>(world, {.dp = 2}, c, steps), serial);
    check_same_training(train<policy<sw::full_shard, sw::wrap_min_params>, sw::serial_plan>(
                            world, {.dp = 2, .min_num_params = 3000}, c, steps),
                        serial);
    check_same_training(
        train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 2, .checkpoint_blocks = true}, c, steps), serial);
    check_same_training(
        train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 2, .sequences = 12}, uneven, steps),
        uneven_serial);
    check_same_training(train<policy<sw::full_shard>, sw::serial_plan>(
                            world, {.dp = 2, .sequences = 12, .prefetch = true}, uneven, steps),
                        uneven_serial);
    check_same_training(
        train<policy<sw::full_shard>, sw::serial_plan>(
            world, {.dp = 2, .checkpoint_blocks = true, .validation_forward = true, .prefetch = true}, c, steps),
        serial);
  } else if (world.size() == 4) {
    check_same_training(
        train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 2, .replicate = 2, .prefetch = true}, c, steps),
        serial);
    check_same_training(train<policy<sw::full_shard>, sequence_parallel>(world, {.dp = 2, .prefetch = true}, c, steps),
                        serial);
    check_same_training(train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 4}, c, steps), serial);
    check_same_training(train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 2, .replicate = 2}, c, steps),
                        serial);
    check_same_training(train<policy<sw::full_shard>, sequence_parallel>(world, {.dp = 2}, c, steps), serial);
    check_same_training(
        train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 4, .sequences = 12}, uneven, steps),
        uneven_serial);
    check_same_training(train<policy<sw::full_shard>, tp_only>(world, {.dp = 2, .sequences = 12}, uneven, steps),
                        uneven_serial);
  } else {
    FAIL("run with mpiexec -n 1, 2 or 4");
  }
}

TEST_CASE("FSDP: a forward without backward, microbatches, tied embeddings, repeated key-value heads, MPI mesh") {
  int const steps = llama_cases::steps();
  auto const world = worlds::mpi();
  auto const c = llama_cases::small_config();
  if (world.size() == 2) {
    auto const serial = serial_run(c, steps);
    check_same_training(
        train<policy<sw::shard_grad_op>, sw::serial_plan>(world, {.dp = 2, .validation_forward = true}, c, steps),
        serial);
    check_same_training(train<policy<sw::full_shard>, sw::serial_plan>(world, {.dp = 2, .microbatches = 2}, c, steps),
                        serial_run(c, steps, 4, 2));
  } else if (world.size() == 4) {
    auto tied = c;
    tied.tie_word_embeddings = true;
    check_same_training(train<policy<sw::full_shard>, sequence_parallel>(world, {.dp = 2}, tied, steps),
                        serial_run(tied, steps));
    auto one_kv_head = c;
    one_kv_head.kv_heads = 1;
    check_same_training(train<policy<sw::full_shard>, sequence_parallel>(world, {.dp = 2}, one_kv_head, steps),
                        serial_run(one_kv_head, steps));
  }
}

TEST_CASE("FSDP mixed precision equals the unsharded run that rounds the same way, MPI mesh") {
  int const steps = llama_cases::steps();
  auto const world = worlds::mpi();
  auto const c = llama_cases::small_config();
  using bf16 = Eigen::bfloat16;
  using gathers_bf16 = sw::fsdp_policy<sw::full_shard, blocks, sw::mixed_precision<bf16, float>>;
  using all_bf16 = sw::fsdp_policy<sw::full_shard, blocks, sw::mixed_precision<bf16, bf16>>;
  if (world.size() == 1) {
    check_same_training(train<all_bf16, sw::serial_plan>(world, {.dp = 1}, c, steps),
                        bf16_reference(c, steps, 1, true));
  } else if (world.size() == 2) {
    check_same_training(train<gathers_bf16, sw::serial_plan>(world, {.dp = 2}, c, steps),
                        bf16_reference(c, steps, 2, false), bf16_rounding);
    check_same_training(train<all_bf16, sw::serial_plan>(world, {.dp = 2}, c, steps), bf16_reference(c, steps, 2, true),
                        bf16_rounding);
    check_same_training(train<gathers_bf16, sw::serial_plan>(world, {.dp = 2, .prefetch = true}, c, steps),
                        bf16_reference(c, steps, 2, false), bf16_rounding);
  } else {
    check_same_training(train<gathers_bf16, sequence_parallel>(world, {.dp = 2}, c, steps),
                        bf16_reference(c, steps, 2, false), bf16_rounding);
  }
}

TEST_CASE("FSDP processes that shard by different strategies are refused at fully_shard, MPI mesh") {
  auto const world = worlds::mpi();
  int const n = world.size();
  if (n < 2) return;
  auto const dp = sw::make_mesh<"dp">(world, {n});
  std::string message = "(no error)";
  try {
    sw::models::Llama<float> model(llama_cases::small_config());
    if (dp.rank() == 1)  // no_shard on process 1: it would all-reduce where the others reduce-scatter
      (void)sw::fully_shard<policy<sw::no_shard>>(model, dp);
    else
      (void)sw::fully_shard<policy<sw::full_shard>>(model, dp);
  } catch (sw::error const& e) {
    message = e.what();
  }
  std::string expected =
      "shardwise::fully_shard: the ranks of mesh axis \"dp\" shard by different strategies: rank 0 has full_shard; "
      "rank 1 has no_shard";
  for (int r = 2; r < n; ++r) expected += "; rank " + std::to_string(r) + " has full_shard";
  expected += ". Give every rank the same fsdp_policy strategy (full_shard, shard_grad_op or no_shard)";
  CHECK(message == expected);
}

TEST_CASE("FSDP of a MoeLlama, its experts sharded with the rest, equals the unsharded run, MPI mesh") {
  fsdp_cases::check_moe_llama(worlds::mpi());
}

TEST_CASE("FSDP of a MoeLlama with its experts over ep drawn from dp, each expert sharded over its replicas, MPI") {
  auto const world = worlds::mpi();
  for (int ep : {1, 2, 4})
    if (ep <= world.size() && world.size() % ep == 0) fsdp_cases::check_moe_llama_placed(world, ep);
}
