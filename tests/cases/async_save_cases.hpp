// The asynchronous save's cases, run on the thread mesh (test_checkpoint_async.cpp) and under MPI
// (test_checkpoint_async_mpi.cpp): each takes a dp 1 x tp N mesh and a folder all ranks name alike.
// A gate on the save's test hook holds every rank's background write at its start until the training thread
// lets it go, so that what happens while a write is in flight is shown by the order of events, not by timing.
#pragma once
#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <shardwise/checkpoint/async_save.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include "cases/llama_cases.hpp"

namespace async_cases {

namespace sw = shardwise;
namespace models = shardwise::models;
namespace fs = std::filesystem;
using Model = models::Llama<float, models::llama_plan<false>>;

inline models::LlamaConfig config(std::uint64_t seed = 1234) {
  auto c = llama_cases::small_config();
  c.kv_heads = 2, c.vocabulary = 62, c.seed = seed;  // padded vocabulary and repeated key-value heads at TP 4
  return c;
}

/// Every parameter's bytes, in traversal order: equal vectors are bit-identical parameters.
inline std::vector<std::string> parameter_bytes(Model& model) {
  std::vector<std::string> all;
  sw::detail::for_each_parameter(model, [&](auto const& p) {
    using T = typename std::remove_cvref_t<decltype(p)>::tensor_type::Scalar;
    all.emplace_back(reinterpret_cast<char const*>(p.value->data()),
                     static_cast<std::size_t>(p.value->size()) * sizeof(T));
  });
  return all;
}

/// The staging folder of the save in flight beside `ckpt` (the one without an index yet), or empty.
inline fs::path live_staging(fs::path const& ckpt) {
  for (auto const& entry : fs::directory_iterator(ckpt.parent_path()))
    if (entry.path().filename().string().rfind("." + ckpt.filename().string() + ".incomplete", 0) == 0 &&
        !fs::exists(entry.path() / sw::checkpoint_index_name))
      return entry.path();
  return {};
}

/// The gate: each rank's background write stops at "rank_file_begin" until released (or 60 s have passed,
/// which only a save that never returns to its training thread lets happen: then `timed_out` says so).
struct gate_state {
  std::mutex mutex;
  std::condition_variable changed;
  bool armed = false;  // saves before arm() pass untouched
  std::array<bool, 8> begun{}, released{}, written{}, timed_out{};
  std::array<std::thread::id, 8> writer{};
  int break_rank = -1;  // this tp rank's write fails: its rank folder's name is taken by a regular file
  fs::path ckpt;
  void reset(fs::path const& folder, int broken = -1) {
    std::lock_guard const hold(mutex);
    armed = false;
    begun = released = written = timed_out = {};
    writer = {};
    break_rank = broken, ckpt = folder;
  }
};
inline gate_state gate;

inline void gate_hook(std::string_view stage, int rank) {
  auto const r = static_cast<std::size_t>(rank);
  std::unique_lock lock(gate.mutex);
  if (!gate.armed) return;
  if (stage == "rank_file_written") gate.written[r] = true;
  if (stage != "rank_file_begin") return;
  gate.begun[r] = true;
  gate.writer[r] = std::this_thread::get_id();
  if (rank == gate.break_rank) {  // a path component that is a regular file: fails for root too
    fs::path const folder = live_staging(gate.ckpt) / sw::rank_folder(rank, 0);
    std::ofstream(folder.string()) << "not a folder";
  }
  gate.changed.notify_all();
  if (!gate.changed.wait_for(lock, std::chrono::seconds(60), [&] { return gate.released[r]; }))
    gate.timed_out[r] = true;
}

/// Installs the gate for the lifetime of the object (install it before the ranks start).
struct gated {
  explicit gated(fs::path const& ckpt, int broken = -1) {
    gate.reset(ckpt, broken);
    sw::detail::checkpoint_save_hook = gate_hook;
  }
  ~gated() { sw::detail::checkpoint_save_hook = nullptr; }
  gated(gated const&) = delete;
  gated& operator=(gated const&) = delete;
};

/// Collective: from here on, saves stop at the gate (and break_rank's fails).
template <class Tp>
void arm(Tp const& tp, bool on = true) {
  sw::barrier(tp);
  {
    std::lock_guard const hold(gate.mutex);  // every rank: one gate per process under MPI, one for all on threads
    gate.armed = on;
  }
  sw::barrier(tp);
}

/// On the training thread: waits until this rank's background write has begun (true), or 60 s.
inline bool wait_until_begun(int rank) {
  std::unique_lock lock(gate.mutex);
  return gate.changed.wait_for(lock, std::chrono::seconds(60), [&] { return gate.begun[std::size_t(rank)]; });
}
inline void release(int rank) {
  std::lock_guard const hold(gate.mutex);
  gate.released[std::size_t(rank)] = true;
  gate.changed.notify_all();
}

/// A parameter-changing training step: forward, loss, backward, AdamW.
template <class Tp, class Dp>
void train_step(Model& model, sw::AdamW<float>& optimizer, Tp const& tp, Dp const& dp, int step) {
  auto const c = model.config();
  std::vector<std::int64_t> ids, targets;
  llama_cases::batch(c, step, 2, 0, 2, ids, targets);
  auto const logits = model.forward(ids);
  auto const result = models::llama_loss(tp, logits, targets, c.vocabulary);
  model.backward(result.dlogits);
  optimizer.step(sw::finish_gradients(model), dp);
  sw::zero_grad(model);
}

/// Saved through an async_save, then loaded into a model of other weights: every parameter bit for bit; and
/// a second save through the same saver (after a step) replaces the first.
template <class Mesh>
void round_trip(Mesh const& mesh, fs::path const& ckpt) {
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  Model model(config());
  sw::parallelize(model, tp);
  sw::AdamW<float> optimizer({.learning_rate = 1e-2f});
  auto const load = [&] {
    Model loaded(config(999));
    sw::parallelize(loaded, tp);
    auto const index = sw::load_sharded(loaded, tp, ckpt);
    return std::pair{index.step, parameter_bytes(loaded)};
  };
  sw::async_save saver;
  sw::save_sharded(model, tp, ckpt, 1, saver, {{"run", "async"}});
  auto const first = parameter_bytes(model);
  CHECK(saver.pending());
  saver.wait();
  CHECK(!saver.pending());
  CHECK(saver.snapshot_bytes() > 0);
  auto const got = load();
  CHECK(got.first == 1);
  REQUIRE(got.second.size() == first.size());
  for (std::size_t i = 0; i < first.size(); ++i) CHECK_MESSAGE(got.second[i] == first[i], "parameter " << i);

  train_step(model, optimizer, tp, dp, 1);
  auto const second = parameter_bytes(model);
  REQUIRE(second != first);                     // the second save has something new to write
  sw::save_sharded(model, tp, ckpt, 2, saver);  // committed by poll() once written
  while (!saver.poll()) std::this_thread::yield();
  CHECK(!saver.pending());
  auto const again = load();
  CHECK(again.first == 2);
  CHECK(again.second == second);
  CHECK(sw::verify_checkpoint(ckpt, true).empty());
}

/// The save returns while its background write is held at the gate; the training thread then runs a step
/// (forward, backward, AdamW), sees poll() answer false and no rank file written, and lets the write go. The
/// checkpoint holds the parameters as they were when save_sharded was called, not after the step.
template <class Mesh>
void overlaps_a_training_step(Mesh const& mesh, fs::path const& ckpt) {
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  int const rank = tp.rank();
  Model model(config());
  sw::parallelize(model, tp);
  sw::AdamW<float> optimizer({.learning_rate = 1e-2f});
  train_step(model, optimizer, tp, dp, 0);
  auto const saved = parameter_bytes(model);
  sw::async_save saver;
  arm(tp);
  sw::save_sharded(model, tp, ckpt, 5, saver);
  REQUIRE(wait_until_begun(rank));  // this rank's write has started, on another thread, and is held
  {
    std::lock_guard const hold(gate.mutex);
    CHECK(gate.writer[std::size_t(rank)] != std::this_thread::get_id());
  }
  train_step(model, optimizer, tp, dp, 1);  // while the write is in flight
  CHECK(parameter_bytes(model) != saved);
  CHECK(!saver.poll());  // collective: no rank's write can have finished
  {
    std::lock_guard const hold(gate.mutex);
    CHECK(!gate.written[std::size_t(rank)]);
  }
  CHECK(!fs::exists(ckpt / sw::checkpoint_index_name));  // nothing committed yet
  release(rank);
  saver.wait();
  {
    std::lock_guard const hold(gate.mutex);
    CHECK(gate.written[std::size_t(rank)]);
    CHECK(!gate.timed_out[std::size_t(rank)]);
  }
  Model loaded(config(999));
  sw::parallelize(loaded, tp);
  CHECK(sw::load_sharded(loaded, tp, ckpt).step == 5);
  CHECK(parameter_bytes(loaded) == saved);
}

/// `folder_owner`'s background write fails (its rank folder's name is a regular file); `at_next_save`: the
/// failure is raised by the next save through the saver (which then does not start), else by wait(). Every
/// rank raises it with the failing rank's words; the previous checkpoint is unchanged and loads.
template <class Mesh>
void failure_is_raised_on_every_rank(Mesh const& mesh, fs::path const& ckpt, int folder_owner, bool at_next_save) {
  auto const tp = sw::submesh<"tp">(mesh);
  int const rank = tp.rank();
  Model model(config());
  sw::parallelize(model, tp);
  sw::save_sharded(model, tp, ckpt, 3);  // the previous checkpoint, synchronously
  auto const kept = parameter_bytes(model);
  sw::async_save saver;
  arm(tp);
  {
    Model other(config(4321));
    sw::parallelize(other, tp);
    sw::save_sharded(other, tp, ckpt, 4, saver);
  }
  REQUIRE(wait_until_begun(rank));
  release(rank);
  std::string message;
  try {
    if (at_next_save)
      sw::save_sharded(model, tp, ckpt, 5, saver);
    else
      saver.wait();
  } catch (sw::error const& e) {
    message = e.what();
  }
  INFO("rank " << rank << ": " << message);
  CHECK(message.rfind("shardwise::save_sharded: \"", 0) == 0);
  CHECK(message.find("while writing the rank's shard in the background); the previous checkpoint is unchanged") !=
        std::string::npos);
  CHECK(message.find(sw::rank_folder(folder_owner, 0)) != std::string::npos);
  if (rank != folder_owner)
    CHECK(message.find("[reported by tp rank " + std::to_string(folder_owner) + "]") != std::string::npos);
  // The same words on every rank: the message without the reporter's note, gathered as its length and sum.
  std::string const words = message.substr(0, message.find(" [reported by"));
  std::uint64_t sum = words.size();
  for (unsigned char ch : words) sum = sum * 131 + ch;
  CHECK(sw::all_reduce(tp, sum, sw::Max{}) == sw::all_reduce(tp, sum, sw::Min{}));
  CHECK(!saver.pending());  // the failed save is over, and the next one (at_next_save) did not start
  Model loaded(config(999));
  sw::parallelize(loaded, tp);
  CHECK(sw::load_sharded(loaded, tp, ckpt).step == 3);
  CHECK(parameter_bytes(loaded) == kept);
  arm(tp, false);  // a save through the same saver works again
  sw::save_sharded(model, tp, ckpt, 6, saver);
  saver.wait();
  CHECK(sw::load_sharded(loaded, tp, ckpt).step == 6);
}

}  // namespace async_cases
