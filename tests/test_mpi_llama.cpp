// The Llama training cases on the MPI mesh: at 2 ranks TP 2 with and without sequence parallelism, and with
// the embeddings not parallelized (optimum-neuron's parallelize_embeddings=False); at 4 ranks TP 4, dp 2 x tp 2
// and dp 2 x tp 2 with ZeRO-1; each against the unsharded run computed on every rank.
#include <doctest/doctest.h>

#include "cases/llama_accumulation_cases.hpp"
#include "cases/llama_bf16_cases.hpp"
#include "cases/llama_cases.hpp"
#include "cases/llama_context_cases.hpp"
#include "cases/llama_freeze_cases.hpp"
#include "cases/llama_lora_cases.hpp"
#include "cases/llama_packed_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("Llama: sharded training equals the unsharded run, MPI mesh") {
  int const steps = llama_cases::steps();
  auto const world = worlds::mpi();
  auto const c = llama_cases::small_config();
  auto const serial = llama_cases::train<shardwise::serial_plan>(shardwise::serial_world(), 1, steps, false, c);
  using tp_only = shardwise::models::llama_plan<false>;
  using sequence_parallel = shardwise::models::llama_plan<true>;
  if (world.size() == 2) {
    llama_cases::check_same_run(llama_cases::train<tp_only>(world, 1, steps, false, c), serial);
    llama_cases::check_same_run(llama_cases::train<sequence_parallel>(world, 1, steps, false, c), serial);
    using embeddings_whole = shardwise::models::llama_plan<false, false>;
    llama_cases::check_same_run(llama_cases::train<embeddings_whole>(world, 1, steps, false, c), serial);
  } else if (world.size() == 4) {
    llama_cases::check_same_run(llama_cases::train<tp_only>(world, 1, steps, false, c), serial);
    llama_cases::check_same_run(llama_cases::train<sequence_parallel>(world, 2, steps, false, c), serial);
    llama_cases::check_same_run(llama_cases::train<sequence_parallel>(world, 2, steps, true, c), serial);
  } else {
    FAIL("run with mpiexec -n 2 or -n 4");
  }
}

TEST_CASE("Llama: fewer key-value heads than ranks, and a padded vocabulary, MPI mesh") {
  int const steps = llama_cases::steps();
  auto const world = worlds::mpi();
  using sequence_parallel = shardwise::models::llama_plan<true>;
  auto against_serial = [&](shardwise::models::LlamaConfig const& c, int dp, bool zero1) {
    auto const serial = llama_cases::train<shardwise::serial_plan>(shardwise::serial_world(), 1, steps, false, c);
    llama_cases::check_same_run(llama_cases::train<sequence_parallel>(world, dp, steps, zero1, c), serial);
  };
  auto c = llama_cases::small_config();
  c.kv_heads = world.size() == 4 ? 2 : 1;  // kv_size_multiplier 2 at tp 4 and at tp 2
  INFO("key-value heads " << c.kv_heads << " at TP " << world.size());
  against_serial(c, 1, false);
  if (world.size() == 4) {
    INFO("and dp 2 x tp 2 with ZeRO-1, 1 key-value head");
    c.kv_heads = 1;
    against_serial(c, 2, true);
  }
  c = llama_cases::small_config();
  c.vocabulary = world.size() == 4 ? 30 : 63;  // padded to 32 / 64
  INFO("vocabulary " << c.vocabulary << " at TP " << world.size());
  against_serial(c, 1, false);
}

TEST_CASE("Llama with its sequences cut over cp ranks equals the unsharded run, MPI mesh") {
  llama_context_cases::check_all(worlds::mpi());
}

TEST_CASE("Gradient accumulation with the loss over the step's valid tokens equals the full batch, MPI mesh") {
  auto const c = llama_packed_cases::config();
  llama_accumulation_cases::check_all(worlds::mpi(), c, llama_accumulation_cases::full_batch(c));
}

TEST_CASE("Frozen parameters: a frozen run at TP 2 and 4 (± SP, ZeRO-1) equals the unsharded one, MPI mesh") {
  llama_freeze_cases::check_all(worlds::mpi());
}

TEST_CASE("bf16_autocast: TP (± SP), FSDP, FSDP x TP, cp and pp equal the unsharded run under autocast, MPI mesh") {
  auto const alone = llama_bf16_cases::train<shardwise::models::llama_plan<false>>(shardwise::serial_world(), true);
  llama_bf16_cases::check_all(worlds::mpi(), alone);
}

TEST_CASE("LoRA adapters: TP 2 and 4 (± SP, ZeRO-1) equal the unsharded run, MPI mesh") {
  llama_lora_cases::check_all(worlds::mpi());
}

TEST_CASE("Llama on packed documents of any length equals the unsharded run (Qwen2- and Qwen3-like), MPI mesh") {
  for (auto const& c : llama_packed_cases::configs()) {
    INFO((c.qk_norm ? "Qwen3-like" : "Qwen2-like"));
    auto const serial = llama_packed_cases::train_packed<shardwise::serial_plan>(shardwise::serial_world(), c, 5);
    llama_packed_cases::check_all(worlds::mpi(), c, serial);
    llama_packed_cases::check_cp(worlds::mpi(), c);
    if (worlds::mpi().size() == 2) {  // FSDP at dp 2 and pp 2 against the unsharded run over both ranks' rows
      auto const two_rows = llama_packed_cases::train_packed_fsdp(shardwise::serial_world(), c, 5, 2);
      llama_packed_cases::check_fsdp(worlds::mpi(), c, two_rows);
      llama_packed_cases::check_pipeline(worlds::mpi(), c, two_rows);
    }
  }
}
