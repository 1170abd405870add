#pragma once
// Sharded checkpoints of a parallelized model, resharded on load.
//
//   sw::save_sharded(model, tp, "ckpt", step);   // every tp rank writes its shard, collectively
//   sw::load_sharded(model, tp, "ckpt");         // into the same or another tp size; no communication
//   Model& m = sw::load_sharded(lazy, tp, "ckpt");  // a sw::Lazy model: only this rank's shard is allocated
//   sw::load_consolidated(model, tp, "model.safetensors");  // one file of full tensors, sliced per rank
//   sw::load_pretrained(model, tp, "hf_folder", mapping);   // a save_pretrained folder: renamed, transposed, split
//
// Layout (optimum-neuron's): ckpt/tensor_parallel_shards/tp_rank_XX_pp_rank_00/model.safetensors holds the
// rank's pieces of the parameters — a tensor cut over tp is saved once, in pieces; a replicated one by tp rank
// 0 only — and ckpt/shardwise_checkpoint.json lists every tensor (name, global shape, dtype, placement on tp,
// the pieces and the boxes they hold), the mesh and the step. Global shapes are the model's own: vocabulary
// padding is left out and repeated key-value heads are saved once. A parameter is named after its layer's
// place in the model ("layers.0.attention.wq") with ".weight" or ".bias".
//
// The save is atomic at the folder level: everything goes to a hidden sibling ".ckpt.incomplete"; tp rank 0
// then reopens every rank's file, checks that the pieces cover every tensor exactly once, writes the index
// and swaps the folder in (renameat2 RENAME_EXCHANGE, or two renames where the file system has no exchange).
// Until then the previous checkpoint in "ckpt" is untouched and loadable. A save runs in phases, collective
// steps apart from the writing: stage_save (the leader's lock, the generation, the staging folder),
// plan_rank_file (the rank's pieces as runs of its parameters' storage, no copy), write_rank_file (one
// sequential write per run, each piece's checksum computed as it is written, fsync; touches neither model nor
// mesh) and commit_save (the leader's cover check from the files, the index, the swap). An asynchronous save
// (checkpoint/async_save.hpp, sw::async_save) runs write_rank_file on a background thread from a snapshot.
//
// Loading reads, on each rank, only the boxes of the pieces its shard needs (pread, straight into the parameter
// where whole rows are wanted). With data parallelism, call save_sharded on one replica (dp rank 0) and
// load_sharded on every rank. Optimizer state is saved beside the model by checkpoint/optimizer_state.hpp.
//
// This header has save_sharded and includes the rest: loading in checkpoint/sharded_load.hpp (and of full
// tensors, Hugging Face's among them, in checkpoint/pretrained.hpp), what both share
// (parameter layouts, the walk over the model, agreed errors, the atomic commit) in sharded_layout.hpp.
#include <fcntl.h>

#include <Eigen/Core>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/adapters/eigen.hpp"
#include "shardwise/checkpoint/atomic_file.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/model_tensors.hpp"
#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/safetensors_write.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/checkpoint/sharded_load.hpp"
#include "shardwise/checkpoint/verify.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/experts/expert_parallel.hpp"
#include "shardwise/nn/lazy.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/plan/module.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES  // JSON is parsed only where the entry points are compiled
#include <nlohmann/json.hpp>
#endif

namespace shardwise {

namespace detail {

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
/// The stage's tensors (name, dtype, global shape, placement), in model order, as its rank files record them
/// for the index; with `placed_only`, only the experts placed on this ep rank.
inline nlohmann::json stage_tensors(model_tensors const& model, int tp_size, bool placed_only) {
  nlohmann::json list = nlohmann::json::array();
  model.for_each(tp_size, 0, false, [&](tensor_layout const& t, tensor_values const&) {
    if (t.mirror) return;                  // saved by the stage that owns it
    if (placed_only && !t.placed) return;  // saved by the first ep rank
    list.push_back(
        {{"name", t.name}, {"dtype", dtype_name(t.type)}, {"shape", t.stored_shape()}, {"placement", t.placement()}});
  });
  return list;
}

/// The index's tensors, read from the first tp rank's file of every stage (and of every ep rank that lists its
/// placed experts), in stage order (the model's).
inline void add_stage_tensors(checkpoint_index& index, safetensors_file const& first_of_stage) {
  auto const listed = first_of_stage.metadata().find("shardwise.tensors");
  if (listed == first_of_stage.metadata().end()) return;  // a dp rank's rows of tensors dp rank 0 lists (FSDP)
  for (auto const& t : nlohmann::json::parse(listed->second)) {
    std::string const name = t.at("name").get<std::string>();
    if (index.find(name))
      fail("shardwise::save_sharded: tensor \"", name, "\" is saved by two pipeline stages or ep ranks (again in \"",
           first_of_stage.path(), "\"); give each stage its own layers, and place each expert on one ep rank");
    index.tensors.push_back({name,
                             *parse_dtype(t.at("dtype").get<std::string>()),
                             t.at("shape").get<std::vector<std::uint64_t>>(),
                             t.at("placement").get<std::string>(),
                             {}});
  }
}
#endif

/// The folders of asynchronous saves still in flight in this process, with the thread that staged each (their
/// leader's): a save of such a folder from that thread would wait for its own lock for ever, so it is refused.
/// A folder is known by its absolute path ("ckpt" and "/run/ckpt" are one folder when /run is the current one).
struct saves_in_flight {
  std::mutex mutex;
  std::multiset<std::pair<std::string, std::thread::id>> entries;

  static saves_in_flight& instance() {
    static saves_in_flight registry;
    return registry;
  }
  /// The name a folder is registered under: its absolute path, normalized (the current folder's, if that fails).
  [[nodiscard]] static std::string key(std::filesystem::path const& target) {
    std::error_code failed;
    auto const absolute = std::filesystem::absolute(target, failed);
    return (failed ? target : absolute).lexically_normal().string();
  }
  [[nodiscard]] bool holds(std::filesystem::path const& target) {
    std::string const name = key(target);
    std::lock_guard const hold(mutex);
    return entries.contains({name, std::this_thread::get_id()});
  }
  void insert(std::string const& name, std::thread::id by) {
    std::lock_guard const hold(mutex);
    entries.insert({name, by});
  }
  void erase(std::string const& name, std::thread::id by) noexcept {
    std::lock_guard const hold(mutex);
    auto const entry = entries.find({name, by});
    if (entry != entries.end()) entries.erase(entry);
  }
};

/// A save between its preparation and its commit: the folder it replaces, the staging folder it writes, the
/// lock (held by the leader) and the generation that names it.
struct staged_save {
  std::filesystem::path target, temp;
  std::uint64_t generation = 0;
  directory_lock lock;
};

/// Collective over the group: the leader takes the folder's lock, checks the folder and clears dead saves'
/// staging folders; the group agrees on a new generation; the leader creates the staging folder.
inline staged_save stage_save(save_group const& group, std::filesystem::path const& dir) {
  namespace fs = std::filesystem;
  staged_save staged;
  staged.target = normalized_dir(dir);
  fs::path const& target = staged.target;
  bool const leader = group.leader();
  std::string error;
  // The leader holds the folder's lock from staging to commit, so two savers of one folder take turns; each save
  // stages in a folder of its own, named by its generation, which every rank file and the index carry.
  if (leader) {
    try {
      if (saves_in_flight::instance().holds(target))
        fail("shardwise::save_sharded: an asynchronous save of \"", target.string(),
             "\" from this rank (sw::async_save) is still in flight; call its wait() first, or save through that "
             "sw::async_save, which waits for it");
      staged.lock = directory_lock(target);
      if (fs::exists(target) && !fs::exists(target / checkpoint_index_name) && !fs::is_empty(target))
        fail("shardwise::save_sharded: \"", target.string(),
             "\" exists and is not a shardwise checkpoint; give a new or empty folder, or a previous "
             "checkpoint's, which is then replaced");
      remove_stale_staging(target);                      // under the lock, any staging folder is a dead save's
      if (fs::exists(target / checkpoint_index_name)) {  // a previous checkpoint left aside is superseded
        std::error_code ignored;
        fs::remove_all(previous_checkpoint_dir(target), ignored);
      }
      staged.generation = new_generation();
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  group.agree(error, "preparing the folder", target);
  staged.generation = group.max(staged.generation);  // the leader's: the others pass 0
  staged.temp = staging_dir(target, staged.generation);
  if (leader) {
    try {
      fs::create_directories(staged.temp / "tensor_parallel_shards");
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  group.agree(error, "preparing the folder", target);
  return staged;
}

/// What one rank writes: its pieces of the model's tensors (each the bytes of its stored rows, as runs of the
/// memory that holds them: the parameters' own storage, or a snapshot of it) and its file's metadata.
struct rank_file_plan {
  std::string file;  ///< Relative to the staging folder: "tensor_parallel_shards/tp_rank_XX_pp_rank_YY/..."
  struct piece {
    std::string name;
    dtype type = dtype::F32;
    std::vector<std::uint64_t> shape;
    std::vector<std::span<std::byte const>> runs;
  };
  std::vector<piece> pieces;
  std::map<std::string, std::string> metadata;  ///< The checksums are added as the file is written.
  std::deque<std::vector<std::byte>> copies;    ///< Pieces copied out of values that do not outlive the walk.

  /// The bytes of every piece.
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (auto const& p : pieces)
      for (auto const& r : p.runs) n += r.size();
    return n;
  }
};

/// This rank's pieces of the model, pointing into the parameters (no copy): each run of local rows is contiguous
/// in the row-major storage, and a piece is its runs in stored order. Rows a model hands out itself (FSDP's
/// shards, its optimizer state) are copied, as they may not outlive the walk.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY rank_file_plan plan_rank_file(model_tensors const& model, save_group const& group,
                                                                std::uint64_t generation, std::int64_t step);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY rank_file_plan plan_rank_file(model_tensors const& model, save_group const& group,
                                                                std::uint64_t generation, std::int64_t step) {
  int const size = group.tp_size, rank = group.tp_rank;
  rank_file_plan plan;
  plan.file = group.folder(rank, group.pp_rank, group.dp_rank) + "/model.safetensors";
  nlohmann::json offsets = nlohmann::json::object();
  model.for_each(size, rank, false, [&](tensor_layout const& t, tensor_values const& value) {
    if (!group.writes || (group.placed_only && !t.placed)) return;
    if (t.shard_dim < 0 && rank != 0) return;  // replicated: tp rank 0 saves it
    if (t.mirror) return;                      // another stage's weight: saved there
    auto const runs = row_runs(t, true);
    if (runs.empty()) return;
    std::size_t rows = 0;
    for (auto const& r : runs) {
      if (r.stored != runs.front().stored + rows)
        fail("shardwise::save_sharded: tensor \"", t.name,
             "\": this rank's rows are not one range of the stored tensor; this layout is not supported");
      rows += r.count;
    }
    std::byte const* from = value.data;
    std::size_t const row_bytes = t.local_cols * dtype_size(value.type);
    rank_file_plan::piece piece{t.name, t.type, {rows}, {}};
    if (!t.is_vector) piece.shape.push_back(t.local_cols);
    for (auto const& r : runs) {
      std::span<std::byte const> const run(from + r.local * row_bytes, r.count * row_bytes);
      auto& last = piece.runs;
      if (!last.empty() && last.back().data() + last.back().size() == run.data())
        last.back() = std::span<std::byte const>(last.back().data(), last.back().size() + run.size());
      else
        last.push_back(run);
    }
    if (!model.values_outlive_walk) {  // `value` may be the walk's temporary (FSDP's rows): keep a copy
      auto& copy = plan.copies.emplace_back();
      for (auto const& run : piece.runs) copy.insert(copy.end(), run.begin(), run.end());
      piece.runs = {std::span<std::byte const>(copy)};
    }
    std::vector<std::uint64_t> offset{runs.front().stored};
    if (!t.is_vector) offset.push_back(t.col_offset);
    offsets[t.name] = offset;
    plan.pieces.push_back(std::move(piece));
  });
  plan.metadata = {{"format", "pt"},
                   {"shardwise.offsets", offsets.dump()},
                   {"shardwise.generation", hex64(generation)},
                   {"shardwise.step", std::to_string(step)}};
  if (rank == 0 && (group.dp_rank == 0 || group.placed_only))
    plan.metadata["shardwise.tensors"] = stage_tensors(model, size, group.placed_only).dump();
  return plan;
}
#endif

/// Writes the rank's file into the staging folder `temp` (one sequential write per run, each piece's checksum
/// computed as it is written; fsync), then `also_write`. Touches neither the model nor the mesh: an
/// asynchronous save runs it on its background thread.
inline void write_rank_file(rank_file_plan const& plan, std::filesystem::path const& temp, int tp_rank,
                            std::function<void(std::filesystem::path const&, int)> const& also_write) {
  if (checkpoint_save_hook) checkpoint_save_hook("rank_file_begin", tp_rank);
  safetensors_writer writer;
  for (auto const& p : plan.pieces) writer.add(p.name, p.type, p.shape, p.runs);
  std::filesystem::create_directories((temp / plan.file).parent_path());
  writer.write(temp / plan.file, plan.metadata, "shardwise.checksums");
  if (also_write) also_write(temp, tp_rank);
  if (checkpoint_save_hook) checkpoint_save_hook("rank_file_written", tp_rank);
}

/// The index's fields that come from the model and the call, kept from the start of a save to its commit.
inline checkpoint_index index_head(model_tensors const& model, save_group const& group, std::int64_t step,
                                   std::uint64_t generation, std::map<std::string, std::string> const& metadata) {
  checkpoint_index index;
  index.step = step;
  index.tp = group.tp_size, index.pp = group.pp_size, index.dp = group.dp_size;
  index.metadata = metadata;
  index.generation = generation;
  if (model.config) index.config = *model.config;
  return index;
}

/// Collective over the group, once every rank has written its file: the leader reads the pieces from every rank
/// file (as the files hold them, not as the ranks believe they were written), checks that they cover every
/// tensor exactly once, writes the index and swaps the folder in; the group agrees on the outcome. The previous
/// checkpoint is removed, or with `previous_out` (the leader's) left for the caller, as commit_directory does.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void commit_save(save_group const& group, staged_save& staged, checkpoint_index index,
                                                   std::filesystem::path* previous_out = nullptr);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void commit_save(save_group const& group, staged_save& staged, checkpoint_index index,
                                                   std::filesystem::path* previous_out) {
  namespace fs = std::filesystem;
  std::string error;
  fs::path const& temp = staged.temp;
  if (group.leader()) {
    try {
      int const stages = group.pp_size, size = group.tp_size;
      for (int s = 0; s < stages; ++s)
        for (int d = 0; d < group.dp_size; ++d)
          add_stage_tensors(index, safetensors_file((temp / group.folder(0, s, d) / "model.safetensors").string()));
      for (int s = 0; s < stages; ++s)
        for (int d = 0; d < group.dp_size; ++d)
          for (int r = 0; r < size; ++r) {
            std::string const file = group.folder(r, s, d) + "/model.safetensors";
            safetensors_file shard((temp / file).string());
            auto const offsets = nlohmann::json::parse(shard.metadata().at("shardwise.offsets"));
            auto const checksums = nlohmann::json::parse(shard.metadata().at("shardwise.checksums"));
            for (tensor_info const& info : shard.tensors()) {
              checkpoint_tensor* t = index.find(info.name);
              if (!t || info.type != t->type)
                fail("shardwise::save_sharded: \"", shard.path(), "\": tensor \"", info.name,
                     "\" is not the model's (or has another dtype)");
              t->pieces.push_back({file, offsets.at(info.name).get<std::vector<std::uint64_t>>(), info.shape});
              t->pieces.back().checksum = checksums.at(info.name).get<std::string>();
            }
          }
      for (auto const& t : index.tensors) check_coverage(t, temp.string());
      std::string const json = to_json(index);
      std::span<std::byte const> const pieces[] = {std::as_bytes(std::span(json.data(), json.size()))};
      write_file_atomically(temp / checkpoint_index_name, pieces);
      fsync_directory(temp / "tensor_parallel_shards");
      fsync_directory(temp);
      if (checkpoint_save_hook) checkpoint_save_hook("before_commit", group.tp_rank);
      commit_directory(temp, staged.target, previous_out);
    } catch (std::exception const& e) {
      error = e.what();
      std::error_code ignored;
      if (!checkpoint_refuse_removal) fs::remove_all(temp, ignored);  // after a commit: the replaced checkpoint
    }
  }
  group.agree(error, "checking and committing the checkpoint", staged.target);
}
#endif

/// Every rank of the group writes its file; the leader checks the pieces, writes the index and commits.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void save_sharded_stage(
    model_tensors const& model, save_group const& group, std::filesystem::path const& dir, std::int64_t step,
    std::map<std::string, std::string> const& metadata,
    std::function<void(std::filesystem::path const&, int)> const& also_write);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void save_sharded_stage(
    model_tensors const& model, save_group const& group, std::filesystem::path const& dir, std::int64_t step,
    std::map<std::string, std::string> const& metadata,
    std::function<void(std::filesystem::path const&, int)> const& also_write) {
  staged_save staged = stage_save(group, dir);
  std::string error;
  try {
    write_rank_file(plan_rank_file(model, group, staged.generation, step), staged.temp, group.tp_rank, also_write);
  } catch (std::exception const& e) {
    error = e.what();
  }
  group.agree(error, "writing the rank's shard", staged.target);
  commit_save(group, staged, index_head(model, group, step, staged.generation, metadata));
}
#endif

/// Refuses a save without the ep ranks of a model whose experts are placed over them: each rank holds its own
/// experts, which the files of the others would lack.
template <class Model>
void refuse_placed_save(Model& model) {
  if (placed_experts_in(model))
    fail(
        "shardwise::save_sharded: the model's experts are placed over ep ranks (sw::expert_parallelize), each rank "
        "holding its own; save it with its optimizer on every data-parallel (ep) rank: save_sharded(model, "
        "optimizer, tp, dp, dir, step)");
}

}  // namespace detail

/// Saves the model's parameters as a sharded checkpoint in `dir`, collectively over the tp mesh (every tp rank
/// calls it). `dir` is replaced atomically: a new folder, or a previous checkpoint.
/// `also_write(folder, tp_rank)`, if given, runs on every tp rank after its shard is written and may add files
/// under `folder` (the checkpoint being built): they are committed with it, atomically.
template <class Model, class TpMesh>
void save_sharded(Model& model, TpMesh const& tp, std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {},
                  std::function<void(std::filesystem::path const&, int)> const& also_write = {}) {
  detail::refuse_placed_save(model);
  auto group = detail::save_group_over(tp);
  group.tp_size = tp.size(), group.tp_rank = tp.rank();
  detail::save_sharded_stage(detail::tensors_of(model), group, dir, step, metadata, also_write);
}

/// Saves a model cut into pipeline stages, collectively over tp and the pipeline axis `pp` (every rank of
/// both calls it with its stage): each rank writes tensor_parallel_shards/tp_rank_XX_pp_rank_YY/ with its
/// stage's pieces, and one index lists every stage's tensors, so the checkpoint loads at any pp and tp size
/// (load_sharded into a stage reads only its own tensors) and consolidates whole.
template <class Model, class TpMesh, class PpMesh>
  requires requires(PpMesh const& pp) { pp.comm(0); }
void save_sharded(Model& model, TpMesh const& tp, PpMesh const& pp, std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  detail::refuse_placed_save(model);
  auto group = detail::save_group_over(tp, pp);
  group.tp_size = tp.size(), group.tp_rank = tp.rank(), group.pp_size = pp.size(), group.pp_rank = pp.rank();
  detail::save_sharded_stage(detail::tensors_of(model), group, dir, step, metadata, {});
}

}  // namespace shardwise
