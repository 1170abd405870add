#pragma once
// Checkpoints of the Llama model under FSDP (shardwise/fsdp/checkpoint.hpp): trained 3 steps and saved under one
// dp x tp, loaded into a model built from another seed under another dp x tp, straight from the sharded
// checkpoint and from its consolidated file: every parameter must equal the saver's, to the bit. Hybrid
// sharding saves from its first replica and loads into every replica.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <shardwise/checkpoint/consolidate.hpp>
#include <shardwise/fsdp/checkpoint.hpp>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "cases/fsdp_cases.hpp"

namespace fsdp_checkpoint_cases {

namespace fs = std::filesystem;
namespace sw = shardwise;
namespace models = shardwise::models;

using full_shard = sw::fsdp_policy<sw::full_shard, fsdp_cases::blocks>;
using no_shard = sw::fsdp_policy<sw::no_shard, fsdp_cases::blocks>;
using Parameters = std::vector<llama_cases::TrainedTensor>;

/// Builds the model from `c` (declared with sw::Lazy when Lazy) under Policy at dp ranks (tp: the rest of the
/// world) and calls fn(sharded, tp, with_tp): with tp 1 the model is sharded over the 1-D dp mesh and with_tp is
/// false (the checkpoint calls take no tp mesh), else over the dp x tp mesh.
template <class Policy, bool Lazy = false, class World, class Fn>
void under_fsdp(World const& world, models::LlamaConfig const& c, int dp, Fn&& fn) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp, world.size() / dp});
  auto const tp = sw::submesh<"tp">(mesh);
  using Model = models::Llama<float, fsdp_cases::tp_only>;
  std::conditional_t<Lazy, sw::Lazy<Model>, Model> model(c);
  if (tp.size() == 1) {
    sw::parallelize(model, tp);  // one rank: the plan's layers, uncut
    auto sharded = sw::fully_shard<Policy>(model, sw::submesh<"dp">(mesh));
    fn(sharded, tp, std::false_type{});
  } else {
    auto sharded = sw::fully_shard<Policy>(model, mesh);
    fn(sharded, tp, std::true_type{});
  }
}

/// How many loads this rank read tensor data in (checkpoint_load_hook's "read_begin"): per thread, so that a
/// thread mesh's ranks count apart as MPI processes do.
inline thread_local int reads_begun = 0;
inline bool const counting_reads = (sw::detail::checkpoint_load_hook = [](std::string_view stage, int) {
  if (stage == "read_begin") ++reads_begun;
}, true);

/// only_rank0_reads: the first rank of the grid reads, the others receive their shards.
inline sw::load_options const first_rank_reads{.only_rank0_reads = true};

inline void check_equal(Parameters const& got, Parameters const& expected) {
  REQUIRE(got.size() == expected.size());
  for (std::size_t i = 0; i < got.size(); ++i) {
    INFO(expected[i].path);
    CHECK(got[i].path == expected[i].path);
    CHECK(got[i].values == expected[i].values);  // bytes copied: equal to the bit
  }
}

/// Trains 3 steps under SavePolicy at save_dp and saves in `dir`; loads it, and then its consolidated file,
/// under LoadPolicy at load_dp into a model of another seed; both must hold the saved parameters.
template <class SavePolicy, class LoadPolicy, class World>
void check_resharded(World const& world, fs::path const& dir, models::LlamaConfig const& c, int save_dp, int load_dp,
                     int sequences = 4) {
  INFO("saved at dp " << save_dp << " x tp " << world.size() / save_dp << ", loaded at dp " << load_dp << " x tp "
                      << world.size() / load_dp);
  Parameters saved;
  under_fsdp<SavePolicy>(world, c, save_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    auto const all = sw::make_mesh<"all">(world, {world.size()});
    fsdp_cases::Setup const setup{.dp = save_dp, .sequences = sequences};
    saved = fsdp_cases::train_steps(sharded, tp, all, sharded.data_mesh().rank(), save_dp, setup, c, 3).parameters;
    if constexpr (decltype(with_tp)::value)
      sw::save_sharded(sharded, tp, dir, 3, {{"saved_by", "fsdp"}});
    else
      sw::save_sharded(sharded, dir, 3, {{"saved_by", "fsdp"}});
  });
  auto const index = sw::read_checkpoint_index(dir);
  CHECK(index.tp == world.size() / save_dp);
  CHECK(index.dp == save_dp);
  CHECK(index.metadata.at("saved_by") == "fsdp");

  auto other = c;
  other.seed += 7;  // every value the load leaves alone would differ
  under_fsdp<LoadPolicy>(world, other, load_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    sw::checkpoint_index loaded;
    if constexpr (decltype(with_tp)::value)
      loaded = sw::load_sharded(sharded, tp, dir);
    else
      loaded = sw::load_sharded(sharded, dir);
    CHECK(loaded.step == 3);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
  });

  fs::path const file = dir.string() + ".safetensors";
  if (world.rank() == 0) sw::consolidate(dir, file);
  world.barrier();
  under_fsdp<LoadPolicy>(world, other, load_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    if constexpr (decltype(with_tp)::value)
      (void)sw::load_consolidated(sharded, tp, file);
    else
      (void)sw::load_consolidated(sharded, file);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
  });
  // Rank 0 alone reads, from the folder and from the file, and sends every other rank its shards.
  under_fsdp<LoadPolicy>(world, other, load_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    reads_begun = 0;
    if constexpr (decltype(with_tp)::value)
      (void)sw::load_sharded(sharded, tp, dir, first_rank_reads);
    else
      (void)sw::load_sharded(sharded, dir, first_rank_reads);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
    if constexpr (decltype(with_tp)::value)
      (void)sw::load_consolidated(sharded, tp, file, {}, first_rank_reads);
    else
      (void)sw::load_consolidated(sharded, file, {}, first_rank_reads);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
    CHECK(reads_begun == (world.rank() == 0 ? 2 : 0));
  });
  // The node's first rank reads for every rank of the node (sw::node_turns; on threads, and under MPI on one host,
  // the whole world), into a model whose values all differ until loaded.
  under_fsdp<LoadPolicy>(world, other, load_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    sw::load_options node_reads = first_rank_reads;
    node_reads.turns = sw::node_turns(world);
    reads_begun = 0;
    if constexpr (decltype(with_tp)::value)
      (void)sw::load_sharded(sharded, tp, dir, node_reads);
    else
      (void)sw::load_sharded(sharded, dir, node_reads);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
    CHECK(reads_begun == (node_reads.turns->rank == 0 ? 1 : 0));
  });
  // Declared with sw::Lazy (no rank holds the whole model): refused until a load fills the shards.
  under_fsdp<LoadPolicy, true>(world, other, load_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    auto const refused = [&] {
      CHECK_THROWS_WITH_AS(sharded.forward(std::vector<std::int64_t>(c.sequence, 1)),
                           doctest::Contains("declared with sw::Lazy and its shards hold no values yet"), sw::error);
    };
    refused();
    // A load that fails (the optimizer's moments are not in this checkpoint) leaves it refused, and a save of
    // its zeros is refused too.
    sw::AdamW<float> optimizer(fsdp_cases::adamw_options);
    if constexpr (decltype(with_tp)::value) {
      CHECK_THROWS_WITH_AS(sw::load_sharded(sharded, optimizer, tp, dir), doctest::Contains("holds no optimizer state"),
                           sw::error);
      CHECK_THROWS_WITH_AS(sw::save_sharded(sharded, tp, dir.string() + "_unfilled", 0),
                           doctest::Contains("no load has filled its shards"), sw::error);
    } else {
      CHECK_THROWS_WITH_AS(sw::load_sharded(sharded, optimizer, dir), doctest::Contains("holds no optimizer state"),
                           sw::error);
      CHECK_THROWS_WITH_AS(sw::save_sharded(sharded, dir.string() + "_unfilled", 0),
                           doctest::Contains("no load has filled its shards"), sw::error);
    }
    refused();
    if constexpr (decltype(with_tp)::value)
      (void)sw::load_consolidated(sharded, tp, file, {}, first_rank_reads);
    else
      (void)sw::load_consolidated(sharded, file, {}, first_rank_reads);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
  });
  world.barrier();
}

/// Training resumed from a checkpoint with the optimizer state equals training straight through: 3 steps
/// under dp save_dp, saved with the AdamW state, loaded under dp load_dp into a model of another seed and a new
/// optimizer, 3 more steps; against the unsharded run of 6 steps (losses, norms with clipping, parameters).
/// Async: saved through an sw::async_save, and a 4th step trained while it writes before wait(): the checkpoint
/// must still be the state at the call (the resumed run would differ otherwise).
template <bool Lazy = false, bool Async = false, class World>
void check_resumed(World const& world, fs::path const& dir, int save_dp, int load_dp) {
  INFO("saved with the optimizer at dp " << save_dp << (Async ? " asynchronously" : "") << ", resumed at dp " << load_dp
                                         << (Lazy ? ", lazily" : ""));
  auto const c = llama_cases::small_config();
  auto const all = sw::make_mesh<"all">(world, {world.size()});
  under_fsdp<full_shard>(world, c, save_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    sw::AdamW<float> optimizer(fsdp_cases::adamw_options);
    (void)fsdp_cases::train_steps(sharded, tp, all, sharded.data_mesh().rank(), save_dp, {.dp = save_dp}, c, 3,
                                  &optimizer);
    sw::async_save saver;
    if constexpr (decltype(with_tp)::value && Async)
      sw::save_sharded(sharded, optimizer, tp, dir, 3, saver);
    else if constexpr (Async)
      sw::save_sharded(sharded, optimizer, dir, 3, saver);
    else if constexpr (decltype(with_tp)::value)
      sw::save_sharded(sharded, optimizer, tp, dir, 3);
    else
      sw::save_sharded(sharded, optimizer, dir, 3);
    if constexpr (Async) {
      (void)fsdp_cases::train_steps(sharded, tp, all, sharded.data_mesh().rank(), save_dp, {.dp = save_dp}, c, 1,
                                    &optimizer, 3);  // while the save writes: its snapshot is the call's state
      saver.wait();
    }
  });
  auto other = c;
  other.seed += 7;
  llama_cases::Run resumed;
  under_fsdp<full_shard, Lazy>(world, other, load_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    sw::AdamW<float> optimizer(fsdp_cases::adamw_options);
    if constexpr (decltype(with_tp)::value)  // the moments relay as the parameters do
      (void)sw::load_sharded(sharded, optimizer, tp, dir, first_rank_reads);
    else
      (void)sw::load_sharded(sharded, optimizer, dir, first_rank_reads);
    CHECK(optimizer.steps() == 3);
    resumed = fsdp_cases::train_steps(sharded, tp, all, sharded.data_mesh().rank(), load_dp, {.dp = load_dp}, other, 3,
                                      &optimizer, 3);
  });
  auto expected = fsdp_cases::serial_run(c, 6);
  expected.losses.erase(expected.losses.begin(), expected.losses.begin() + 3);
  expected.norms.erase(expected.norms.begin(), expected.norms.begin() + 3);
  fsdp_cases::check_same_training(resumed, expected);
  world.barrier();
}

/// The same model not under FSDP, at dp x tp (tp: the rest of the world) with ZeRO-1: 3 steps from the start and a
/// save with the optimizer (`save`), or a load of one with it and 3 steps from step 3. Every rank returns those
/// steps (the whole batch's losses, the norms, every parameter whole).
template <class World>
llama_cases::Run zero1_run(World const& world, models::LlamaConfig const& c, int dp_size, fs::path const& dir,
                           bool save) {
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {dp_size, world.size() / dp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  models::Llama<float, fsdp_cases::tp_only> model(c);
  auto options = fsdp_cases::adamw_options;
  options.zero1 = true;
  sw::AdamW<float> optimizer(options);
  sw::parallelize(model, tp);
  if (!save) CHECK(sw::load_sharded(model, optimizer, tp, dp, dir).step == 3);
  int const first = save ? 0 : 3, per_rank = 4 / dp_size;
  llama_cases::Run run;
  std::vector<std::int64_t> ids, targets;
  for (int step = first; step < first + 3; ++step) {
    llama_cases::batch(c, step, 4, dp.rank() * per_rank, per_rank, ids, targets);
    auto const logits = model.forward(ids);
    auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
    model.backward(result.dlogits);
    run.norms.push_back(optimizer.step(sw::finish_gradients(model), dp));
    sw::zero_grad(model);
    run.losses.push_back(sw::all_reduce(dp, result.loss, sw::Avg{}));
  }
  if (save) sw::save_sharded(model, optimizer, tp, dp, dir, 3);
  run.parameters = llama_cases::whole_parameters(model);
  return run;
}

/// AdamW's state across the two ways of sharding it: saved under ZeRO-1 at zero1_dp x tp, resumed under FSDP at
/// fsdp_dp x tp, and saved under FSDP, resumed under ZeRO-1; each resumed run equal to the unsharded run that never
/// stopped (steps 4 to 6), within the FSDP runs' tolerances (check_same_training).
template <class World>
void check_resumed_across(World const& world, fs::path const& dir, int zero1_dp, int fsdp_dp) {
  INFO("ZeRO-1 at dp " << zero1_dp << ", FSDP at dp " << fsdp_dp << ", of " << world.size() << " ranks");
  auto const c = llama_cases::small_config();
  auto other = c;  // the resumed model starts elsewhere: the load must set every value
  other.seed += 7;
  auto const all = sw::make_mesh<"all">(world, {world.size()});
  auto expected = fsdp_cases::serial_run(c, 6);
  expected.losses.erase(expected.losses.begin(), expected.losses.begin() + 3);
  expected.norms.erase(expected.norms.begin(), expected.norms.begin() + 3);

  (void)zero1_run(world, c, zero1_dp, dir, true);
  llama_cases::Run resumed;
  under_fsdp<full_shard>(world, other, fsdp_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    sw::AdamW<float> optimizer(fsdp_cases::adamw_options);
    if constexpr (decltype(with_tp)::value)
      (void)sw::load_sharded(sharded, optimizer, tp, dir);
    else
      (void)sw::load_sharded(sharded, optimizer, dir);
    CHECK(optimizer.steps() == 3);
    resumed = fsdp_cases::train_steps(sharded, tp, all, sharded.data_mesh().rank(), fsdp_dp, {.dp = fsdp_dp}, other, 3,
                                      &optimizer, 3);
  });
  fsdp_cases::check_same_training(resumed, expected);

  under_fsdp<full_shard>(world, c, fsdp_dp, [&](auto& sharded, auto const& tp, auto with_tp) {
    sw::AdamW<float> optimizer(fsdp_cases::adamw_options);
    (void)fsdp_cases::train_steps(sharded, tp, all, sharded.data_mesh().rank(), fsdp_dp, {.dp = fsdp_dp}, c, 3,
                                  &optimizer);
    if constexpr (decltype(with_tp)::value)
      sw::save_sharded(sharded, optimizer, tp, dir, 3);
    else
      sw::save_sharded(sharded, optimizer, dir, 3);
  });
  fsdp_cases::check_same_training(zero1_run(world, other, zero1_dp, dir, false), expected);
  world.barrier();
}

/// How many of the next background writes fail (the first writer that begins, per process): "no space left".
inline std::atomic<int> writes_to_fail{0};
inline bool const failing_writes = (sw::detail::checkpoint_save_hook = [](std::string_view stage, int) {
  if (stage == "rank_file_begin" && writes_to_fail.fetch_sub(1) > 0)
    throw std::runtime_error("no space left on device (a test's failed write)");
}, true);

/// An asynchronous save under FSDP x TP whose one rank's background write fails: wait() raises it on every rank
/// in that rank's words, the previous checkpoint is unchanged and loads, and the next save through the saver works.
template <class World>
void check_async_failure(World const& world, fs::path const& dir) {
  auto const c = llama_cases::small_config();
  under_fsdp<full_shard>(world, c, world.size() / 2, [&](auto& sharded, auto const& tp, auto) {
    sw::save_sharded(sharded, tp, dir, 1);  // the previous checkpoint, synchronously
    auto const kept = fsdp_cases::whole_parameters(sharded);
    sw::async_save saver;
    world.barrier();
    if (world.rank() == 1) writes_to_fail = 1;  // one process under MPI; the first writer of all on threads
    world.barrier();
    sw::save_sharded(sharded, tp, dir, 2, saver);
    std::string message;
    try {
      saver.wait();
    } catch (sw::error const& e) {
      message = e.what();
    }
    INFO("rank " << world.rank() << ": " << message);
    CHECK(message.find("no space left on device (a test's failed write)") != std::string::npos);
    CHECK(message.find("while writing the rank's shard in the background); the previous checkpoint is unchanged") !=
          std::string::npos);
    world.barrier();
    writes_to_fail = 0;
    world.barrier();
    CHECK(sw::load_sharded(sharded, tp, dir).step == 1);
    check_equal(fsdp_cases::whole_parameters(sharded), kept);
    sw::save_sharded(sharded, tp, dir, 3, saver);  // the saver works again
    saver.wait();
    CHECK(sw::read_checkpoint_index(dir).step == 3);
  });
  world.barrier();
}

/// Hybrid sharding, 2 replicas of dp 2: calls fn(sharded) on a model of config `c` sharded so.
template <class World, class Fn>
void under_hybrid(World const& world, models::LlamaConfig const& c, Fn&& fn) {
  auto const mesh = sw::make_mesh<"replicate", "dp", "tp">(world, {2, 2, 1});
  models::Llama<float, fsdp_cases::tp_only> model(c);
  sw::parallelize(model, sw::submesh<"tp">(mesh));  // one rank: the plan's layers, uncut
  auto sharded = sw::fully_shard<full_shard>(model, sw::submesh<"dp">(mesh), sw::submesh<"replicate">(mesh));
  fn(sharded, sw::submesh<"tp">(mesh), mesh.template coordinate<"replicate">() * 2 + sharded.data_mesh().rank());
}

/// Hybrid sharding saves from its first replica (the index says dp 2) and loads into hybrid (every replica
/// reads the shards) and into full shard at dp 4; a dp 4 checkpoint loads into hybrid. Every parameter equal
/// to the saver's, to the bit.
template <class World>
void check_hybrid(World const& world, fs::path const& dir) {
  auto const c = llama_cases::small_config();
  auto const all = sw::make_mesh<"all">(world, {world.size()});
  Parameters saved;
  under_hybrid(world, c, [&](auto& sharded, auto const& tp, int data_rank) {
    saved = fsdp_cases::train_steps(sharded, tp, all, data_rank, 4, {.dp = 2, .replicate = 2}, c, 3).parameters;
    sw::save_sharded(sharded, dir, 3);
  });
  CHECK(sw::read_checkpoint_index(dir).dp == 2);
  auto other = c;
  other.seed += 7;
  under_hybrid(world, other, [&](auto& sharded, auto const&, int) {
    (void)sw::load_sharded(sharded, dir);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
  });
  under_hybrid(world, other, [&](auto& sharded, auto const&, int) {
    reads_begun = 0;
    (void)sw::load_sharded(sharded, dir, first_rank_reads);  // the second replica receives the first's shards
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
    CHECK(reads_begun == (world.rank() == 0 ? 1 : 0));
  });
  under_hybrid(world, other, [&](auto& sharded, auto const&, int) {  // saved again from the first replica, async
    (void)sw::load_sharded(sharded, dir);
    sw::async_save saver;
    sw::save_sharded(sharded, dir, 5, saver);
    saver.wait();
  });
  CHECK(sw::read_checkpoint_index(dir).step == 5);
  // A background write of the first replica fails: every rank of both replicas raises its words at wait() (the
  // outcome is agreed over the replicas at the commit), none waiting out the timeout, shortened here to show it.
  auto const timeout = world.timeout();
  world.set_timeout(std::chrono::seconds(20));
  under_hybrid(world, other, [&](auto& sharded, auto const&, int) {
    sw::async_save saver;
    world.barrier();
    if (world.rank() == 1) writes_to_fail = 1;  // a process of the first replica under MPI; its first writer on threads
    world.barrier();
    sw::save_sharded(sharded, dir, 6, saver);
    std::string message;
    try {
      saver.wait();
    } catch (sw::error const& e) {
      message = e.what();
    }
    INFO("rank " << world.rank() << ": " << message);
    CHECK(message.find("no space left on device (a test's failed write)") != std::string::npos);
    world.barrier();
    writes_to_fail = 0;
    world.barrier();
  });
  world.set_timeout(timeout);
  CHECK(sw::read_checkpoint_index(dir).step == 5);  // the failed save left the checkpoint as it was
  under_fsdp<full_shard>(world, other, 4, [&](auto& sharded, auto const&, auto) {
    (void)sw::load_sharded(sharded, dir);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
    sw::save_sharded(sharded, dir, 4);  // now a dp 4 checkpoint of the same values
  });
  CHECK(sw::read_checkpoint_index(dir).dp == 4);
  under_hybrid(world, other, [&](auto& sharded, auto const&, int) {
    CHECK(sw::load_sharded(sharded, dir).step == 4);
    check_equal(fsdp_cases::whole_parameters(sharded), saved);
  });
  world.barrier();
}

/// Bad input: a model under FSDP x TP loaded without its tp mesh, and a checkpoint missing a dp rank's folder,
/// are refused with the same words on every rank.
template <class World>
void check_refusals(World const& world, fs::path const& dir) {
  auto const c = llama_cases::small_config();
  int const n = world.size();
  under_fsdp<full_shard>(world, c, n / 2, [&](auto& sharded, auto const& tp, auto) {
    sw::save_sharded(sharded, tp, dir, 1);
    CHECK_THROWS_WITH_AS(sw::load_sharded(sharded, dir),
                         doctest::Contains("load_sharded: the model's parameters are cut over a tensor-parallel group "
                                           "of 2 ranks but no tp mesh was given"),
                         sw::error);
    CHECK_THROWS_WITH_AS(sw::load_sharded(sharded, tp, dir, {.ranks_per_step = 1}),
                         doctest::Contains("under FSDP every rank reads only its own shard"), sw::error);
    // In turns over the node (every rank of the world here), one rank at a time: taken, and it loads.
    sw::load_options turns{.ranks_per_step = 1};
    turns.turns = sw::node_turns(world);
    CHECK_NOTHROW((void)sw::load_sharded(sharded, tp, dir, turns));
    sw::AdamW<float> optimizer(fsdp_cases::adamw_options);
    CHECK_THROWS_WITH_AS(sw::load_sharded(sharded, optimizer, tp, dir),
                         doctest::Contains("holds no optimizer state (it was saved without the optimizer); load the "
                                           "model alone"),
                         sw::error);
    // A flipped byte in one rank's file: the rank that reads it (with only_rank0_reads, rank 0 for everyone)
    // finds it, and every rank raises it.
    fs::path const damaged = dir / sw::rank_folder(1, 0, 1) / "model.safetensors";
    world.barrier();
    if (world.rank() == 0) {
      std::fstream file(damaged, std::ios::in | std::ios::out | std::ios::binary);
      file.seekg(-1, std::ios::end);
      char const last = static_cast<char>(file.get() ^ 0x01);
      file.seekp(-1, std::ios::end);
      file.put(last);
    }
    world.barrier();
    for (auto const& options : {sw::load_options{}, first_rank_reads})
      CHECK_THROWS_WITH_AS(sw::load_sharded(sharded, tp, dir, options),
                           doctest::Contains("does not match the checksum its save recorded"), sw::error);
    world.barrier();
    if (world.rank() == 0) fs::remove_all(dir / sw::rank_folder(1, 0, 1));
    world.barrier();
    for (auto const& options : {sw::load_options{}, first_rank_reads})
      CHECK_THROWS_WITH_AS(sw::load_sharded(sharded, tp, dir, options),
                           doctest::Contains("tp_rank_01_pp_rank_00_dp_rank_01/model.safetensors\" is missing"),
                           sw::error);
  });
  world.barrier();
}

/// Every case at this world size (1, 2 or 4 ranks), in folders under `root` (one the ranks all name alike).
template <class World>
void check_all(World const& world, fs::path const& root) {
  auto const c = llama_cases::small_config();
  int const n = world.size();
  if (world.rank() == 0) fs::create_directories(root);
  world.barrier();
  if (n == 1) {
    check_resharded<full_shard, full_shard>(world, root / "dp1", c, 1, 1);
    check_resumed(world, root / "resumed", 1, 1);
  }
  if (n == 2) {
    check_resumed<false, true>(world, root / "resumed_async", 2, 1);  // dp 2, saved in the background
    check_resharded<full_shard, full_shard>(world, root / "dp2_to_tp2", c, 2, 1);
    check_resharded<full_shard, full_shard>(world, root / "tp2_to_dp2", c, 1, 2);
    check_resharded<no_shard, full_shard>(world, root / "no_shard", c, 2, 2);
    check_resumed(world, root / "resumed", 2, 1);
    check_resumed<true>(world, root / "resumed_lazy", 1, 2);
    check_resumed_across(world, root / "across", 2, 1);  // ZeRO-1 dp 2 <-> FSDP x TP 2
  }
  if (n == 4) {
    check_resharded<full_shard, full_shard>(world, root / "dp2tp2_to_dp4", c, 2, 4);
    check_resharded<full_shard, full_shard>(world, root / "uneven_dp4_to_dp2tp2", fsdp_cases::uneven_config(), 4, 2,
                                            12);
    check_resharded<full_shard, no_shard>(world, root / "tp4_to_no_shard", c, 1, 2);
    check_resumed(world, root / "resumed", 2, 4);
    check_resumed<false, true>(world, root / "resumed_async", 2, 4);  // dp 2 x tp 2, saved in the background
    check_hybrid(world, root / "hybrid");
    check_resumed_across(world, root / "across", 4, 2);  // ZeRO-1 dp 4 <-> FSDP dp 2 x tp 2
  }
  if (n >= 4) check_refusals(world, root / "refusals");
  if (n >= 2) check_async_failure(world, root / "async_failure");
  world.barrier();
  if (world.rank() == 0) fs::remove_all(root);
}

}  // namespace fsdp_checkpoint_cases
