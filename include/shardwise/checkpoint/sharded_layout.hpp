#pragma once
// What sharded save and load share: how each parameter lies on a tp rank and in the checkpoint, the walk over
// a model's parameters under their checkpoint names, errors agreed across the tp group, the atomic commit of
// a checkpoint folder, and the switches tests use to reach the failure paths. See checkpoint/sharded.hpp.
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
#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/adapters/eigen.hpp"
#include "shardwise/checkpoint/atomic_file.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/safetensors_write.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/lazy.hpp"
#include "shardwise/nn/parameter_list.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

namespace detail {

/// For tests: called at the stages of a save — "rank_file_begin" and "rank_file_written" on every rank (before
/// and after it writes its file; on the background thread of an asynchronous save), "before_commit" on tp rank 0,
/// and "previous_moved_aside" on tp rank 0 between the two renames of a commit without RENAME_EXCHANGE.
inline void (*checkpoint_save_hook)(std::string_view stage, int tp_rank) = nullptr;
/// For tests: commit as on a file system without renameat2 RENAME_EXCHANGE (the two renames).
inline bool checkpoint_without_exchange = false;
/// For tests: the checkpoint a commit replaces cannot be removed (as for a user who may not delete its files).
inline bool checkpoint_refuse_removal = false;
/// For tests: called when a rank starts ("read_begin") and ends ("read_end") reading its shard in load_sharded.
inline void (*checkpoint_load_hook)(std::string_view stage, int tp_rank) = nullptr;
/// The most a load stages at once for a column-cut tensor (rows of part of a row are read, then copied into
/// place); whole rows are read straight into the parameter. Tests lower it to exercise many reads per box.
inline std::size_t load_staging_bytes = std::size_t{4} << 20;

/// How one parameter lies on this rank (a block of the physical global tensor, which may hold padded rows and
/// repeated blocks) and in the checkpoint (the stored global tensor, without them).
struct tensor_layout {
  std::string name;
  dtype type = dtype::F32;
  int shard_dim = -1;  // on the tp axis; -1: replicated
  bool is_vector = false;
  std::size_t local_rows = 0, local_cols = 0;
  std::size_t row_offset = 0, col_offset = 0;  // this rank's block in the physical global tensor
  std::size_t physical_rows = 0, cols = 0;
  std::size_t stored_rows = 0;
  std::size_t copies = 1, block = 0;  // repeated blocks: each `block` rows appear `copies` times in a row
  bool mirror = false;                // another stage's copy, named as its owner: loaded from it, never saved
  bool placed = false;                // an expert placed over ep ranks: only this ep rank holds it

  [[nodiscard]] std::vector<std::uint64_t> stored_shape() const {
    if (is_vector) return {stored_rows};
    return {stored_rows, cols};
  }
  [[nodiscard]] std::string placement() const {
    return shard_dim < 0 ? std::string("Replicate()") : "Shard(dim=" + std::to_string(shard_dim) + ")";
  }
  /// The stored row of physical row i (the block's first copy), or stored_rows for padding.
  [[nodiscard]] std::size_t stored_row(std::size_t i) const {
    std::size_t const s = copies > 1 ? (i / (block * copies)) * block + i % block : i;
    return s < stored_rows ? s : stored_rows;
  }
  /// Whether physical row i is the first copy of its block (the one saved).
  [[nodiscard]] bool first_copy(std::size_t i) const { return copies <= 1 || (i / block) % copies == 0; }
};

/// Local rows [local, local + count) that are stored rows [stored, stored + count).
struct row_run {
  std::size_t local, stored, count;
};

/// The runs of this rank's rows; when saving, only first copies.
inline std::vector<row_run> row_runs(tensor_layout const& t, bool saving) {
  std::vector<row_run> runs;
  for (std::size_t k = 0; k < t.local_rows; ++k) {
    std::size_t const i = t.row_offset + k;
    std::size_t const s = t.stored_row(i);
    if (s == t.stored_rows || (saving && !t.first_copy(i))) continue;
    if (!runs.empty() && runs.back().local + runs.back().count == k && runs.back().stored + runs.back().count == s)
      ++runs.back().count;
    else
      runs.push_back({k, s, 1});
  }
  return runs;
}

/// The layout of listed parameter p, named `name` ("layers.0.attention.wq.weight"), on tp rank `rank` of `size`,
/// whose local tensor there is local_rows x local_cols.
template <class T>
tensor_layout layout_of(listed_parameter<T> const& p, std::string name, int size, int rank, std::size_t local_rows,
                        std::size_t local_cols) {
  auto const tp = static_cast<std::size_t>(size);
  tensor_layout t;
  t.mirror = !p.mirror_of.empty();
  t.placed = p.placed_over != nullptr;
  t.name = t.mirror ? std::string(p.mirror_of) : std::move(name);
  t.type = dtype_of<T>;
  t.is_vector = p.is_vector;
  t.local_rows = local_rows;
  t.local_cols = local_cols;
  t.shard_dim = p.shard_dim;
  t.physical_rows = t.local_rows * (t.shard_dim == 0 ? tp : 1);
  t.cols = t.local_cols * (t.shard_dim == 1 ? tp : 1);
  t.row_offset = t.shard_dim == 0 ? t.local_rows * static_cast<std::size_t>(rank) : 0;
  t.col_offset = t.shard_dim == 1 ? t.local_cols * static_cast<std::size_t>(rank) : 0;
  t.copies = p.copies;
  t.block = p.copy_block;
  if (t.copies > 1) {
    if (t.block == 0 || t.physical_rows % (t.block * t.copies) != 0)
      fail("shardwise::checkpoint: tensor \"", t.name, "\": ", t.copies, " copies of blocks of ", t.block,
           " rows do not tile its ", t.physical_rows, " rows");
    t.stored_rows = t.physical_rows / t.copies;
  } else {
    t.stored_rows = p.real_rows ? std::min(t.physical_rows, p.real_rows) : t.physical_rows;  // padding
  }
  return t;
}

/// The same for a typed parameter (sw::Parameter) of the layer at `path`.
template <class Tensor, class G>
tensor_layout layout_of(Parameter<Tensor, G> const& p, std::string const& path, int size, int rank,
                        std::size_t local_rows, std::size_t local_cols) {
  return layout_of(list_entry<typename Tensor::Scalar>(p, {}), path + "." + std::string(p.leaf), size, rank, local_rows,
                   local_cols);
}

/// A lazily declared layer allocated for a load (`materialize`), or refused for a save: a layer that no load has
/// filled has nothing to write.
inline void materialized_for_checkpoint(listed_layer const& l, bool materialize) {
  if (!l.materialized || l.materialized(l.layer)) return;
  if (materialize && l.materialize) l.materialize(l.layer);
  if (!l.materialized(l.layer))
    fail("shardwise::save_sharded: the layer at \"", l.path,
         "\" is not materialized (declared lazily); fill it from a checkpoint or call sw::materialize first");
}

/// Calls fn(layout, value) for every parameter of a model's list (built with names) as it lies on tp rank `rank`
/// of `size`, `value` this rank's matrix or vector. With `materialize`, a lazily declared layer is allocated (this
/// rank's shard) first; without, it is refused.
template <class T, class Fn>
void for_each_listed_tensor(model_list<T> const& list, int size, int rank, bool materialize, Fn&& fn) {
  for (listed_layer const& l : list.layers) {
    materialized_for_checkpoint(l, materialize);
    for (std::size_t i = l.first_parameter; i < l.end_parameter; ++i) {
      listed_parameter<T> const& p = list.parameters[i];
      auto const rows = static_cast<std::size_t>(p.value.rows()), cols = static_cast<std::size_t>(p.value.cols());
      if (p.value.matrix)
        fn(layout_of(p, p.name, size, rank, rows, cols), *p.value.matrix);
      else
        fn(layout_of(p, p.name, size, rank, rows, cols), *p.value.vector);
    }
  }
}

/// Calls fn(layout, value) for every parameter of the model as it lies on tp rank `rank` of `size` (see
/// for_each_listed_tensor). A model whose ranks hold rows of the tp-local tensors (FSDP's shards) hands them out
/// itself: the layout is then of those rows, and `value` a matrix of them that fn may read or overwrite.
template <class Model, class Fn>
void for_each_checkpoint_tensor(Model& model, int size, int rank, bool materialize, Fn&& fn) {
  if constexpr (requires { model.shardwise_for_each_parameter_shard([](auto&&...) {}); }) {
    model.shardwise_for_each_parameter_shard([&](std::string const& name, auto const& p, auto rows, auto cols,
                                                 auto first_row, auto& shard) {
      tensor_layout t = layout_of(p, name, size, rank, static_cast<std::size_t>(rows), static_cast<std::size_t>(cols));
      t.name = name;
      t.row_offset += static_cast<std::size_t>(first_row);
      t.local_rows = static_cast<std::size_t>(shard.rows());
      fn(t, shard);
    });
  } else {
    for_each_listed_tensor(list_model<model_element_t<Model>>(model, {.names = true}), size, rank, materialize, fn);
  }
}

/// " [reported by tp rank 1]", or with a second axis " [reported by tp rank 1 of pp rank 0]" (its name).
template <class Tp, class... Others>
std::string reporter_text(int source, Tp const& tp, Others const&...) {
  if constexpr (sizeof...(Others) == 0)
    return concat(" [reported by ", Tp::names[0], " rank ", source, "]");
  else
    return concat(" [reported by ", Tp::names[0], " rank ", source % tp.size(), " of ",
                  std::tuple_element_t<0, std::tuple<Others...>>::names[0], " rank ", source / tp.size(), "]");
}

/// Every rank of the axes (tp, and pp for a pipeline's save) passes its error (empty if none). If any failed,
/// every rank throws the same message: that of the lowest failing rank, sent over the axes (so threads and MPI
/// processes all report the cause); no rank throws before all have heard. An error that is not shardwise's own
/// is put in shardwise's words for `who` ("save_sharded", "load_pretrained", ...): a save adds that the
/// previous checkpoint is unchanged.
template <class... Axes>
void agree_on_errors_across(std::string const& error, std::string_view stage, std::filesystem::path const& dir,
                            std::string_view who, Axes const&... axes) {
  int size = 1, rank = 0;  // over all axes, the first one fastest
  ((rank += axes.rank() * size, size *= axes.size()), ...);
  Eigen::VectorXd failed(1);
  failed(0) = error.empty() ? 0.0 : static_cast<double>(size - rank);
  (all_reduce_on(axes.comm(0), failed, op_kind::max), ...);
  if (failed(0) == 0.0) return;
  int const source = size - static_cast<int>(failed(0));
  std::string message;
  if (rank == source)
    message = error.rfind("shardwise::", 0) == 0
                  ? error
                  : concat("shardwise::", who, ": \"", dir.string(), "\": ", error, " (while ", stage, ")",
                           who.rfind("save", 0) == 0 ? "; the previous checkpoint is unchanged" : "");
  constexpr std::size_t longest = 2048;
  Eigen::VectorXd text = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(longest));
  for (std::size_t i = 0; i < message.size() && i < longest; ++i)
    text(static_cast<Eigen::Index>(i)) = static_cast<double>(static_cast<unsigned char>(message[i]));
  (all_reduce_on(axes.comm(0), text, op_kind::sum), ...);  // only the source wrote: the sum is its message
  message.clear();
  for (Eigen::Index i = 0; i < text.size() && text(i) != 0.0; ++i)
    message.push_back(static_cast<char>(static_cast<unsigned char>(text(i))));
  if constexpr (sizeof...(Axes) > 0)  // none: this rank's own error
    if (source != rank) message += reporter_text(source, axes...);
  throw shardwise::error(message);
}

/// agree_on_errors_across over the tp axis alone.
template <class TpMesh>
void agree_on_errors(TpMesh const& tp, std::string const& error, std::string_view stage,
                     std::filesystem::path const& dir, std::string_view who = "save_sharded") {
  agree_on_errors_across(error, stage, dir, who, tp);
}

/// The pipeline axis of a model that is not cut into stages: one stage.
struct single_stage {
  [[nodiscard]] int rank() const { return 0; }
  [[nodiscard]] int size() const { return 1; }
};

/// The ranks that write one checkpoint together: this rank's place on the tp axis (its layouts), the pipeline
/// axis and FSDP's data-parallel axis (its folder: every dp rank saves its own shards), and how they agree.
struct save_group {
  int tp_size = 1, tp_rank = 0, pp_size = 1, pp_rank = 0, dp_size = 1, dp_rank = 0;
  bool writes = true;  ///< false: this rank's file holds no tensors (another rank saves the same values)
  /// true: this rank's file holds only its placed experts (an ep rank but the first: that one saves the rest)
  bool placed_only = false;
  /// agree_on_errors_across over every axis of the group.
  std::function<void(std::string const& error, std::string_view stage, std::filesystem::path const& dir)> agree;
  std::function<std::uint64_t(std::uint64_t)> max;  ///< The maximum over every rank of the group.
  [[nodiscard]] bool leader() const { return tp_rank == 0 && pp_rank == 0 && dp_rank == 0; }
  [[nodiscard]] std::string folder(int tp, int pp, int dp) const {
    return dp_size > 1 ? rank_folder(tp, pp, dp) : rank_folder(tp, pp);
  }
};

/// The save group over the given meshes (the first one's ranks vary fastest in error reports).
template <class... Axes>
save_group save_group_over(Axes const&... axes) {
  save_group g;
  g.agree = [&axes...](std::string const& error, std::string_view stage, std::filesystem::path const& dir) {
    agree_on_errors_across(error, stage, dir, "save_sharded", axes...);
  };
  g.max = [&axes...](std::uint64_t v) {
    ((v = all_reduce(axes, v, Max{})), ...);
    return v;
  };
  return g;
}

/// Where a commit without RENAME_EXCHANGE moves the checkpoint it replaces: the hidden sibling ".NAME.previous".
inline std::filesystem::path previous_checkpoint_dir(std::filesystem::path const& target) {
  return (target.parent_path().empty() ? std::filesystem::path(".") : target.parent_path()) /
         ("." + target.filename().string() + ".previous");
}

/// Removes the checkpoint a commit replaced, now at `old` (a hidden sibling of `target`). One that cannot be
/// removed stays, taking its disk space at every save: an error that says so, after the commit.
inline void remove_replaced(std::filesystem::path const& old, std::filesystem::path const& target) {
  std::error_code error;
  if (checkpoint_refuse_removal)
    error = std::make_error_code(std::errc::permission_denied);
  else
    std::filesystem::remove_all(old, error);
  if (error)
    fail("shardwise::save_sharded: the new checkpoint is in \"", target.string(),
         "\" (committed), but the checkpoint it replaced, moved to \"", old.string(), "\", cannot be removed (",
         error.message(), "); it keeps its disk space until removed: remove it as a user who may (the next save of \"",
         target.string(), "\" tries again)");
}

/// Puts the complete folder `temp` in place of `target`, atomically when the file system can exchange names.
/// An error after the new checkpoint is in place says so: the save then happened, only its flush or clean-up
/// did not. The previous checkpoint is removed, or with `previous_out` left for the caller to remove: its folder
/// is then stored there (empty if there was none), under `temp`'s name (unique to the save, and free once the
/// new checkpoint is in place), so that removing it after the folder's lock is released races no other save.
inline void commit_directory(std::filesystem::path const& temp, std::filesystem::path const& target,
                             std::filesystem::path* previous_out = nullptr) {
  namespace fs = std::filesystem;
  fs::path const parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::path const previous = previous_checkpoint_dir(target);
  auto const committed = [&](auto&& finish) {
    try {
      finish();
    } catch (std::exception const& e) {
      fail("shardwise::save_sharded: the new checkpoint is in \"", target.string(),
           "\" (committed), but finishing the save failed: ", e.what());
    }
  };
  std::error_code ignored;
  if (!fs::exists(target)) {
    fs::rename(temp, target);
    committed([&] { fsync_directory(parent); });
    fs::remove_all(previous, ignored);  // left by a save that died between the two renames below; now superseded
    return;
  }
  // 0 when swapped; checkpoint_without_exchange answers as a file system without the exchange would.
  int refused = ENOSYS;
  if (!checkpoint_without_exchange)
    refused = ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0 ? 0 : errno;
  auto const retire = [&](fs::path const& old) {
    if (previous_out)
      *previous_out = old;
    else
      remove_replaced(old, target);
  };
  if (refused == 0) {
    committed([&] { fsync_directory(parent); });
    retire(temp);  // now the previous checkpoint
    return;
  }
  if (refused != EINVAL && refused != ENOSYS && refused != ENOTSUP)
    fail("shardwise::save_sharded: cannot swap \"", temp.string(), "\" into \"", target.string(),
         "\": ", std::strerror(refused), "; the previous checkpoint is unchanged");
  // No exchange on this file system: move the previous one aside first (load_sharded falls back to it).
  fs::remove_all(previous);
  fs::rename(target, previous);
  if (checkpoint_save_hook) checkpoint_save_hook("previous_moved_aside", 0);
  fs::rename(temp, target);
  committed([&] { fsync_directory(parent); });
  if (!previous_out) return remove_replaced(previous, target);
  // Left for the caller to remove, perhaps after the folder's lock is released: by then another saver may move
  // its own previous checkpoint to ".NAME.previous". So it is handed over under the staging name this save has
  // just freed (unique to it; a later save removes what is left of it as a dead save's staging folder).
  std::error_code moved;
  fs::rename(previous, temp, moved);
  if (moved) return remove_replaced(previous, target);  // removed now, still under the lock
  *previous_out = temp;
}

inline std::filesystem::path normalized_dir(std::filesystem::path const& dir) {
  auto d = dir.lexically_normal();
  if (d.has_filename()) return d;
  return d.parent_path();  // "ckpt/" -> "ckpt"
}

}  // namespace detail
}  // namespace shardwise
