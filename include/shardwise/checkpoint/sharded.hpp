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
// Until then the previous checkpoint in "ckpt" is untouched and loadable.
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
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/adapters/eigen.hpp"
#include "shardwise/checkpoint/atomic_file.hpp"
#include "shardwise/checkpoint/pretrained.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/safetensors_write.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/checkpoint/sharded_load.hpp"
#include "shardwise/checkpoint/verify.hpp"
#include "shardwise/collectives/collectives.hpp"
#include "shardwise/nn/lazy.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

namespace detail {

/// The stage's tensors (name, dtype, global shape, placement), in model order, as its rank files record them
/// for the index.
template <class Model>
nlohmann::json stage_tensors(Model& model, int tp_size) {
  nlohmann::json list = nlohmann::json::array();
  for_each_checkpoint_tensor(model, tp_size, 0, false, [&](tensor_layout const& t, auto&) {
    if (t.mirror) return;  // saved by the stage that owns it
    list.push_back(
        {{"name", t.name}, {"dtype", dtype_name(t.type)}, {"shape", t.stored_shape()}, {"placement", t.placement()}});
  });
  return list;
}

/// The index's tensors, read from the first tp rank's file of every stage, in stage order (the model's).
inline void add_stage_tensors(checkpoint_index& index, safetensors_file const& first_of_stage) {
  for (auto const& t : nlohmann::json::parse(first_of_stage.metadata().at("shardwise.tensors"))) {
    std::string const name = t.at("name").get<std::string>();
    if (index.find(name))
      fail("shardwise::save_sharded: tensor \"", name, "\" is saved by two pipeline stages (again in \"",
           first_of_stage.path(), "\"); give each stage its own layers");
    index.tensors.push_back({name,
                             *parse_dtype(t.at("dtype").get<std::string>()),
                             t.at("shape").get<std::vector<std::uint64_t>>(),
                             t.at("placement").get<std::string>(),
                             {}});
  }
}

/// Every rank of the group writes its file; the leader checks the pieces, writes the index and commits.
template <class Model>
void save_sharded_stage(Model& model, save_group const& group, std::filesystem::path const& dir, std::int64_t step,
                        std::map<std::string, std::string> const& metadata,
                        std::function<void(std::filesystem::path const&, int)> const& also_write) {
  namespace fs = std::filesystem;
  int const size = group.tp_size, rank = group.tp_rank, stages = group.pp_size, stage = group.pp_rank;
  bool const leader = group.leader();
  std::string const rank_file = group.folder(rank, stage, group.dp_rank) + "/model.safetensors";
  fs::path const target = detail::normalized_dir(dir);
  fs::path const parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::string error;
  // tp rank 0 holds the folder's lock from staging to commit, so two savers of one folder take turns; each save
  // stages in a folder of its own, named by its generation, which every rank file and the index carry.
  detail::directory_lock lock;
  std::uint64_t generation = 0;
  if (leader) {
    try {
      lock = detail::directory_lock(target);
      if (fs::exists(target) && !fs::exists(target / checkpoint_index_name) && !fs::is_empty(target))
        detail::fail("shardwise::save_sharded: \"", target.string(),
                     "\" exists and is not a shardwise checkpoint; give a new or empty folder, or a previous "
                     "checkpoint's, which is then replaced");
      detail::remove_stale_staging(target);  // under the lock, any staging folder is a dead save's
      generation = detail::new_generation();
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  group.agree(error, "preparing the folder", target);
  generation = group.max(generation);  // the leader's: the others pass 0
  fs::path const temp = detail::staging_dir(target, generation);
  if (leader) {
    try {
      fs::create_directories(temp / "tensor_parallel_shards");
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  group.agree(error, "preparing the folder", target);

  try {
    safetensors_writer writer;
    std::deque<std::vector<std::byte>> buffers;  // alive until the writer has written
    nlohmann::json offsets = nlohmann::json::object(), checksums = nlohmann::json::object();
    detail::for_each_checkpoint_tensor(model, size, rank, false, [&](detail::tensor_layout const& t, auto& value) {
      using T = typename std::remove_cvref_t<decltype(value)>::Scalar;
      if (!group.writes) return;
      if (t.shard_dim < 0 && rank != 0) return;  // replicated: tp rank 0 saves it
      if (t.mirror) return;                      // another stage's weight: saved there
      auto const runs = detail::row_runs(t, true);
      if (runs.empty()) return;
      std::size_t rows = 0;
      for (auto const& r : runs) {
        if (r.stored != runs.front().stored + rows)
          detail::fail("shardwise::save_sharded: tensor \"", t.name,
                       "\": this rank's rows are not one range of the stored tensor; this layout is not supported");
        rows += r.count;
      }
      auto& bytes = buffers.emplace_back(rows * t.local_cols * sizeof(T));
      T const* from = value.data();
      for (auto const& r : runs)
        std::memcpy(bytes.data() + (r.stored - runs.front().stored) * t.local_cols * sizeof(T),
                    from + r.local * t.local_cols, r.count * t.local_cols * sizeof(T));
      std::vector<std::uint64_t> shape{rows}, offset{runs.front().stored};
      if (!t.is_vector) shape.push_back(t.local_cols), offset.push_back(t.col_offset);
      writer.add(t.name, t.type, shape, std::span<std::byte const>(bytes));
      offsets[t.name] = offset;
      checksums[t.name] = detail::hex64(checksum64(bytes));
    });
    std::map<std::string, std::string> file_metadata{{"format", "pt"},
                                                     {"shardwise.offsets", offsets.dump()},
                                                     {"shardwise.checksums", checksums.dump()},
                                                     {"shardwise.generation", detail::hex64(generation)},
                                                     {"shardwise.step", std::to_string(step)}};
    if (rank == 0 && group.dp_rank == 0) file_metadata["shardwise.tensors"] = stage_tensors(model, size).dump();
    fs::create_directories((temp / rank_file).parent_path());
    writer.write(temp / rank_file, file_metadata);
    if (also_write) also_write(temp, rank);
    if (detail::checkpoint_save_hook) detail::checkpoint_save_hook("rank_file_written", rank);
  } catch (std::exception const& e) {
    error = e.what();
  }
  group.agree(error, "writing the rank's shard", target);

  if (leader) {
    try {
      checkpoint_index index;
      index.step = step;
      index.tp = size, index.pp = stages, index.dp = group.dp_size;
      index.metadata = metadata;
      index.generation = generation;
      if constexpr (requires { model.shardwise_config(); }) index.config = model.shardwise_config();
      for (int s = 0; s < stages; ++s)
        add_stage_tensors(index, safetensors_file((temp / group.folder(0, s, 0) / "model.safetensors").string()));
      // The pieces as the files hold them (not as this rank believes they were written), then the cover check.
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
                detail::fail("shardwise::save_sharded: \"", shard.path(), "\": tensor \"", info.name,
                             "\" is not the model's (or has another dtype)");
              t->pieces.push_back({file, offsets.at(info.name).get<std::vector<std::uint64_t>>(), info.shape});
              t->pieces.back().checksum = checksums.at(info.name).get<std::string>();
            }
          }
      for (auto const& t : index.tensors) detail::check_coverage(t, temp.string());
      std::string const json = to_json(index);
      std::span<std::byte const> const pieces[] = {std::as_bytes(std::span(json.data(), json.size()))};
      detail::write_file_atomically(temp / checkpoint_index_name, pieces);
      detail::fsync_directory(temp / "tensor_parallel_shards");
      detail::fsync_directory(temp);
      if (detail::checkpoint_save_hook) detail::checkpoint_save_hook("before_commit", rank);
      detail::commit_directory(temp, target);
    } catch (std::exception const& e) {
      error = e.what();
      std::error_code ignored;
      fs::remove_all(temp, ignored);
    }
  }
  group.agree(error, "checking and committing the checkpoint", target);
}

}  // namespace detail

/// Saves the model's parameters as a sharded checkpoint in `dir`, collectively over the tp mesh (every tp rank
/// calls it). `dir` is replaced atomically: a new folder, or a previous checkpoint.
/// `also_write(folder, tp_rank)`, if given, runs on every tp rank after its shard is written and may add files
/// under `folder` (the checkpoint being built): they are committed with it, atomically (optimizer state).
template <class Model, class TpMesh>
void save_sharded(Model& model, TpMesh const& tp, std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {},
                  std::function<void(std::filesystem::path const&, int)> const& also_write = {}) {
  auto group = detail::save_group_over(tp);
  group.tp_size = tp.size(), group.tp_rank = tp.rank();
  detail::save_sharded_stage(model, group, dir, step, metadata, also_write);
}

/// Saves a model cut into pipeline stages, collectively over tp and the pipeline axis `pp` (every rank of
/// both calls it with its stage): each rank writes tensor_parallel_shards/tp_rank_XX_pp_rank_YY/ with its
/// stage's pieces, and one index lists every stage's tensors, so the checkpoint loads at any pp and tp size
/// (load_sharded into a stage reads only its own tensors) and consolidates whole.
template <class Model, class TpMesh, class PpMesh>
  requires requires(PpMesh const& pp) { pp.comm(0); }
void save_sharded(Model& model, TpMesh const& tp, PpMesh const& pp, std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  auto group = detail::save_group_over(tp, pp);
  group.tp_size = tp.size(), group.tp_rank = tp.rank(), group.pp_size = pp.size(), group.pp_rank = pp.rank();
  detail::save_sharded_stage(model, group, dir, step, metadata, {});
}

}  // namespace shardwise
