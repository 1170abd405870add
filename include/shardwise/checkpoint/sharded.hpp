#pragma once
// Sharded checkpoints of a parallelized model, resharded on load.
//
//   sw::save_sharded(model, tp, "ckpt", step);   // every tp rank writes its shard, collectively
//   sw::load_sharded(model, tp, "ckpt");         // into the same or another tp size; no communication
//   Model& m = sw::load_sharded(lazy, tp, "ckpt");  // a sw::Lazy model: only this rank's shard is allocated
//   sw::load_consolidated(model, tp, "model.safetensors");  // one file of full tensors, sliced per rank
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
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/safetensors_write.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/collectives/collectives.hpp"
#include "shardwise/nn/lazy.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise {

namespace detail {

/// For tests: called at the stages of a save — "rank_file_written" on every rank, "before_commit" on tp rank 0,
/// and "previous_moved_aside" on tp rank 0 between the two renames of a commit without RENAME_EXCHANGE.
inline void (*checkpoint_save_hook)(std::string_view stage, int tp_rank) = nullptr;
/// For tests: commit as on a file system without renameat2 RENAME_EXCHANGE (the two renames).
inline bool checkpoint_without_exchange = false;
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

inline std::string join_path(std::string const& prefix, std::string_view name) {
  return prefix.empty() ? std::string(name) : prefix + "." + std::string(name);
}

/// Calls fn(layer, path) for every layer, with its place in the model: "layers.0.attention.wq".
template <class Node, class Fn>
void for_each_named_layer(Node& node, std::string const& prefix, Fn& fn) {
  using N = std::remove_cvref_t<Node>;
  if constexpr (layer<N>) {
    fn(node, prefix);
  } else if constexpr (module<N>) {
    auto children = node.shardwise_children();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (for_each_named_layer(std::get<I>(children), join_path(prefix, child_name(N::shardwise_child_list, I)), fn), ...);
    }
    (std::make_index_sequence<std::tuple_size_v<decltype(children)>>{});
  } else if constexpr (repeated<N>::value) {
    std::size_t i = 0;
    for (auto& element : node) for_each_named_layer(element, join_path(prefix, std::to_string(i++)), fn);
  }
}

/// Calls fn(layout, value) for every parameter of the model as it lies on tp rank `rank` of `size`. With
/// `materialize`, a lazily declared layer is allocated (this rank's shard) first; without, it is refused.
template <class Model, class Fn>
void for_each_checkpoint_tensor(Model& model, int size, int rank, bool materialize, Fn&& fn) {
  auto const tp = static_cast<std::size_t>(size);
  auto visit_layer = [&](auto& l, std::string const& path) {
    if constexpr (requires { l.materialized(); }) {
      if (!l.materialized()) {
        if constexpr (requires { l.shardwise_materialize(); })
          if (materialize) l.shardwise_materialize();
        if (!l.materialized())
          fail("shardwise::save_sharded: the layer at \"", path,
               "\" is not materialized (declared lazily); fill it from a checkpoint or call sw::materialize first");
      }
    }
    auto parameters = l.parameters();
    [&]<std::size_t... I>(std::index_sequence<I...>) {
      (
          [&](auto const& p) {
            using P = std::remove_cvref_t<decltype(p)>;
            using Tensor = typename P::tensor_type;
            using T = typename Tensor::Scalar;
            using G = typename P::grad_placement;
            if (I > 0 && p.value->size() == 0) return;  // a layer without bias
            tensor_layout t;
            t.name = path + (I == 0 ? ".weight" : I == 1 ? ".bias" : ".parameter" + std::to_string(I));
            t.type = dtype_of<T>;
            t.is_vector = Tensor::ColsAtCompileTime == 1;
            t.local_rows = static_cast<std::size_t>(p.value->rows());
            t.local_cols = static_cast<std::size_t>(p.value->cols());
            if constexpr (is_shard_v<G>) t.shard_dim = G::dim < 0 ? G::dim + (t.is_vector ? 1 : 2) : G::dim;
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
            } else if constexpr (requires { l.vocabulary(); }) {
              t.stored_rows = std::min(t.physical_rows, static_cast<std::size_t>(l.vocabulary()));
            } else if constexpr (requires { l.unpadded_out_features(); }) {
              t.stored_rows = std::min(t.physical_rows, l.unpadded_out_features());  // a padded Linear
            } else {
              t.stored_rows = t.physical_rows;
            }
            fn(t, *p.value);
          }(std::get<I>(parameters)),
          ...);
    }
    (std::make_index_sequence<std::tuple_size_v<decltype(parameters)>>{});
  };
  for_each_named_layer(model, std::string(), visit_layer);
}

/// Every tp rank passes its error (empty if none). If any failed, every rank throws the same message: that of
/// the lowest failing rank, sent over the mesh (so threads and MPI processes all report the cause).
template <class TpMesh>
void agree_on_errors(TpMesh const& tp, std::string const& error, std::string_view stage,
                     std::filesystem::path const& dir, std::string_view who = "save_sharded") {
  int const size = tp.size(), rank = tp.rank();
  Eigen::VectorXd failed(1);
  failed(0) = error.empty() ? 0.0 : static_cast<double>(size - rank);
  all_reduce_on(tp.comm(0), failed, op_kind::max);
  if (failed(0) == 0.0) return;
  int const source = size - static_cast<int>(failed(0));
  std::string message;
  if (rank == source)
    message = error.rfind("shardwise::", 0) == 0 ? error
                                                 : concat("shardwise::save_sharded: \"", dir.string(), "\": ", error,
                                                          " (while ", stage, "); the previous checkpoint is unchanged");
  constexpr std::size_t longest = 2048;
  Eigen::VectorXd text = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(longest));
  for (std::size_t i = 0; i < message.size() && i < longest; ++i)
    text(static_cast<Eigen::Index>(i)) = static_cast<double>(static_cast<unsigned char>(message[i]));
  all_reduce_on(tp.comm(0), text, op_kind::sum);  // only the source wrote: the sum is its message
  message.clear();
  for (Eigen::Index i = 0; i < text.size() && text(i) != 0.0; ++i)
    message.push_back(static_cast<char>(static_cast<unsigned char>(text(i))));
  if (source != rank) message += concat(" [reported by tp rank ", source, "]");
  throw shardwise::error(message);
}

/// Puts the complete folder `temp` in place of `target`, atomically when the file system can exchange names.
inline void commit_directory(std::filesystem::path const& temp, std::filesystem::path const& target) {
  namespace fs = std::filesystem;
  fs::path const parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::path const previous = parent / ("." + target.filename().string() + ".previous");
  if (!fs::exists(target)) {
    fs::rename(temp, target);
    fsync_directory(parent);
    fs::remove_all(previous);  // left by a save that died between the two renames below; now superseded
    return;
  }
  // 0 when swapped; checkpoint_without_exchange answers as a file system without the exchange would.
  int refused = ENOSYS;
  if (!checkpoint_without_exchange)
    refused = ::renameat2(AT_FDCWD, temp.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0 ? 0 : errno;
  if (refused == 0) {
    fsync_directory(parent);
    fs::remove_all(temp);  // now the previous checkpoint
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
  fsync_directory(parent);
  fs::remove_all(previous);
}

inline std::filesystem::path normalized_dir(std::filesystem::path const& dir) {
  auto d = dir.lexically_normal();
  if (d.has_filename()) return d;
  return d.parent_path();  // "ckpt/" -> "ckpt"
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
  namespace fs = std::filesystem;
  int const size = tp.size(), rank = tp.rank();
  fs::path const target = detail::normalized_dir(dir);
  fs::path const parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::path const temp = parent / ("." + target.filename().string() + ".incomplete");
  std::string const shard_file = "model.safetensors";
  std::string error;

  if (rank == 0) {
    try {
      if (fs::exists(target) && !fs::exists(target / checkpoint_index_name) && !fs::is_empty(target))
        detail::fail("shardwise::save_sharded: \"", target.string(),
                     "\" exists and is not a shardwise checkpoint; give a new or empty folder, or a previous "
                     "checkpoint's, which is then replaced");
      fs::remove_all(temp);  // what a save that died left behind
      fs::create_directories(temp / "tensor_parallel_shards");
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  detail::agree_on_errors(tp, error, "preparing the folder", target);

  try {
    safetensors_writer writer;
    std::deque<std::vector<std::byte>> buffers;  // alive until the writer has written
    nlohmann::json offsets = nlohmann::json::object();
    detail::for_each_checkpoint_tensor(model, size, rank, false, [&](detail::tensor_layout const& t, auto& value) {
      using T = typename std::remove_cvref_t<decltype(value)>::Scalar;
      if (t.shard_dim < 0 && rank != 0) return;  // replicated: tp rank 0 saves it
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
    });
    fs::create_directories(temp / rank_folder(rank, 0));
    writer.write(temp / rank_folder(rank, 0) / shard_file,
                 {{"format", "pt"}, {"shardwise.offsets", offsets.dump()}, {"shardwise.step", std::to_string(step)}});
    if (also_write) also_write(temp, rank);
    if (detail::checkpoint_save_hook) detail::checkpoint_save_hook("rank_file_written", rank);
  } catch (std::exception const& e) {
    error = e.what();
  }
  detail::agree_on_errors(tp, error, "writing the rank's shard", target);

  if (rank == 0) {
    try {
      checkpoint_index index;
      index.step = step;
      index.tp = size;
      index.metadata = metadata;
      detail::for_each_checkpoint_tensor(model, size, 0, false, [&](detail::tensor_layout const& t, auto&) {
        index.tensors.push_back({t.name, t.type, t.stored_shape(), t.placement(), {}});
      });
      // The pieces as the files hold them (not as this rank believes they were written), then the cover check.
      for (int r = 0; r < size; ++r) {
        std::string const file = rank_folder(r, 0) + "/" + shard_file;
        safetensors_file shard((temp / file).string());
        auto const offsets = nlohmann::json::parse(shard.metadata().at("shardwise.offsets"));
        for (tensor_info const& info : shard.tensors()) {
          checkpoint_tensor* t = index.find(info.name);
          if (!t || info.type != t->type)
            detail::fail("shardwise::save_sharded: \"", shard.path(), "\": tensor \"", info.name,
                         "\" is not the model's (or has another dtype)");
          t->pieces.push_back({file, offsets.at(info.name).get<std::vector<std::uint64_t>>(), info.shape});
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
  detail::agree_on_errors(tp, error, "checking and committing the checkpoint", target);
}

struct load_options {
  /// How many tp ranks read at once (optimum-neuron's num_local_ranks_per_step): the others wait their turn,
  /// which bounds the concurrent disk and page-cache load. 0: all at once, with no communication at all.
  int ranks_per_step = 0;
  /// The RAM-efficient mode: only tp rank 0 opens the files; it reads one tensor at a time and sends every
  /// other rank its shard over the mesh (the others never touch the disk nor hold more than their shard).
  bool only_rank0_reads = false;
};

namespace detail {
/// The loader behind load_sharded and load_consolidated: locate(source, index, label) finds the checkpoint (the
/// folder its pieces' files are relative to, the index, and the file to name in errors); then the model and
/// the index are compared and each rank reads the boxes its shard needs.
template <class Model, class TpMesh, class Locate>
checkpoint_index load_into(Model& model, TpMesh const& tp, std::filesystem::path const& dir,
                           load_options const& options, std::string_view who, Locate&& locate) {
  namespace fs = std::filesystem;
  int const size = tp.size(), rank = tp.rank();
  bool const rank0_reads = options.only_rank0_reads && size > 1;
  bool const in_turns = !rank0_reads && options.ranks_per_step > 0 && options.ranks_per_step < size;
  fs::path source;
  checkpoint_index index;
  std::string index_file;
  auto const check = [&] {
    locate(source, index, index_file);

    // The model and the checkpoint must hold the same tensors with the same global shapes.
    std::size_t matched = 0;
    detail::for_each_checkpoint_tensor(model, size, rank, true, [&](detail::tensor_layout const& t, auto&) {
      checkpoint_tensor const* c = index.find(t.name);
      if (!c)
        detail::fail("shardwise::", who, ": \"", index_file, "\": the model's tensor \"", t.name,
                     "\" is not in the checkpoint; load a checkpoint saved from this model");
      if (c->shape != t.stored_shape())
        detail::fail("shardwise::", who, ": \"", index_file, "\": tensor \"", t.name, "\" has shape ",
                     detail::shape_text(c->shape), " in the checkpoint but ", detail::shape_text(t.stored_shape()),
                     " in the model; load a checkpoint of the same model configuration");
      if (!is_floating(c->type))
        detail::fail("shardwise::", who, ": \"", index_file, "\": tensor \"", t.name, "\" is stored as ",
                     dtype_name(c->type), ", not a floating type; load a checkpoint of this model");
      ++matched;
    });
    if (matched != index.tensors.size())
      for (auto const& c : index.tensors) {
        bool found = false;
        detail::for_each_checkpoint_tensor(
            model, size, rank, true, [&](detail::tensor_layout const& t, auto&) { found = found || t.name == c.name; });
        if (!found)
          detail::fail("shardwise::", who, ": \"", index_file, "\": the checkpoint's tensor \"", c.name,
                       "\" is not in the model; load the checkpoint into the model it was saved from");
      }
    for (auto const& c : index.tensors)
      for (auto const& p : c.pieces)
        if (!fs::exists(source / p.file))
          detail::fail("shardwise::", who, ": \"", (source / p.file).string(), "\" is missing (tensor \"", c.name,
                       "\" has a piece there): the rank folder \"", fs::path(p.file).parent_path().string(),
                       "\" is gone; restore it, or load another checkpoint");
  };
  if (!in_turns && !rank0_reads) {
    check();
  } else {  // every rank must reach the collectives that follow: errors are agreed on first
    std::string error;
    try {
      check();
    } catch (std::exception const& e) {
      error = e.what();
    }
    detail::agree_on_errors(tp, error, "checking the checkpoint against the model", dir, who);
  }

  std::map<std::string, std::unique_ptr<safetensors_file>> files;  // opened on first use
  // Reads the part of tensor t that layout t describes (a rank's shard) into `out` (zeroed by the caller: rows
  // the checkpoint does not hold, vocabulary padding, stay zero), straight from the pieces' files.
  auto const read_layout = [&]<class T>(detail::tensor_layout const& t, T* out, std::vector<T>& box) {
    checkpoint_tensor const& c = *index.find(t.name);
    for (auto const& run : detail::row_runs(t, false)) {
      for (auto const& p : c.pieces) {
        // The piece's part of rows [run.stored, + count) x columns [col_offset, + local_cols).
        std::uint64_t const r0 = std::max<std::uint64_t>(run.stored, p.offset[0]);
        std::uint64_t const r1 = std::min<std::uint64_t>(run.stored + run.count, p.offset[0] + p.shape[0]);
        std::uint64_t const c0 = t.is_vector ? 0 : std::max<std::uint64_t>(t.col_offset, p.offset[1]);
        std::uint64_t const c1 =
            t.is_vector ? 1 : std::min<std::uint64_t>(t.col_offset + t.local_cols, p.offset[1] + p.shape[1]);
        if (r0 >= r1 || c0 >= c1) continue;
        auto& file = files[p.file];
        if (!file) file = std::make_unique<safetensors_file>((source / p.file).string());
        std::string const& stored_name = p.name_in_file.empty() ? t.name : p.name_in_file;
        if (file->info(stored_name).shape != p.shape)
          detail::fail("shardwise::", who, ": \"", file->path(), "\": tensor \"", t.name, "\" has shape ",
                       detail::shape_text(file->info(stored_name).shape), " but the index says ",
                       detail::shape_text(p.shape), "; the checkpoint is corrupt: save it again");
        auto const width = static_cast<std::size_t>(c1 - c0);
        auto read_rows = [&](std::uint64_t first, std::uint64_t end, T* into) {
          extents offset{static_cast<std::size_t>(first - p.offset[0])}, count{static_cast<std::size_t>(end - first)};
          if (!t.is_vector) {
            offset = {static_cast<std::size_t>(first - p.offset[0]), static_cast<std::size_t>(c0 - p.offset[1])};
            count = {static_cast<std::size_t>(end - first), width};
          }
          file->read_box(stored_name, offset, count, into);
        };
        T* const first_row = out + (run.local + (r0 - run.stored)) * t.local_cols;
        if (width == t.local_cols) {  // whole local rows: straight into the parameter, no staging copy
          read_rows(r0, r1, first_row);
          continue;
        }
        // Part of each row (a column-cut tensor): staged, a few MiB of rows at a time, so that the load holds
        // little more than the parameters.
        std::uint64_t const rows_per_read =
            std::max<std::uint64_t>(1, detail::load_staging_bytes / (width * sizeof(T)));
        box.resize(static_cast<std::size_t>(std::min<std::uint64_t>(rows_per_read, r1 - r0)) * width);
        for (std::uint64_t first = r0; first < r1; first += rows_per_read) {
          std::uint64_t const end = std::min(r1, first + rows_per_read);
          read_rows(first, end, box.data());
          for (std::uint64_t r = first; r < end; ++r)
            std::memcpy(first_row + (r - r0) * t.local_cols + (c0 - t.col_offset), box.data() + (r - first) * width,
                        width * sizeof(T));
        }
      }
    }
  };
  auto const read_shard = [&] {
    if (detail::checkpoint_load_hook) detail::checkpoint_load_hook("read_begin", rank);
    detail::for_each_checkpoint_tensor(model, size, rank, true, [&](detail::tensor_layout const& t, auto& value) {
      using T = typename std::remove_cvref_t<decltype(value)>::Scalar;
      value.setZero();
      std::vector<T> box;
      read_layout(t, value.data(), box);
    });
    files.clear();  // unmap before the next ranks' turn
    if (detail::checkpoint_load_hook) detail::checkpoint_load_hook("read_end", rank);
  };
  if (rank0_reads) {
    // tp rank 0 reads one rank's shard of one tensor at a time, straight from the files, and sends it: it never
    // holds a whole tensor, only its own shard and the one block in flight. A block it cannot read goes out as
    // zeros, so no rank waits for one that will not come; the error is agreed on once the tensor is sent, and
    // raised on every rank.
    if (rank == 0 && detail::checkpoint_load_hook) detail::checkpoint_load_hook("read_begin", rank);
    detail::for_each_checkpoint_tensor(model, size, rank, true, [&](detail::tensor_layout const& t, auto& value) {
      using Tensor = std::remove_cvref_t<decltype(value)>;
      using T = typename Tensor::Scalar;
      std::vector<T> box;
      std::string error;
      if (rank != 0) shardwise::recv(tp, value, 0);
      for (int r = size - 1; r >= 0 && rank == 0; --r) {  // rank 0's own block last, into its own storage
        Tensor block = Tensor::Zero(value.rows(), value.cols());
        if (error.empty()) {
          try {
            detail::tensor_layout theirs = t;
            theirs.row_offset = t.shard_dim == 0 ? t.local_rows * static_cast<std::size_t>(r) : 0;
            theirs.col_offset = t.shard_dim == 1 ? t.local_cols * static_cast<std::size_t>(r) : 0;
            read_layout(theirs, block.data(), box);
          } catch (std::exception const& e) {
            error = e.what();
          }
        }
        if (r == 0)
          value = std::move(block);
        else
          shardwise::send(tp, block, r);
      }
      detail::agree_on_errors(tp, error, "reading a tensor on tp rank 0", dir, who);
    });
    if (rank == 0 && detail::checkpoint_load_hook) detail::checkpoint_load_hook("read_end", rank);
    return index;
  }
  if (!in_turns) {
    read_shard();
    return index;
  }
  // In turns of ranks_per_step ranks; an error is carried to the end so that no rank waits forever.
  std::string error;
  for (int turn = 0; turn * options.ranks_per_step < size; ++turn) {
    if (rank / options.ranks_per_step == turn && error.empty()) {
      try {
        read_shard();
      } catch (std::exception const& e) {
        error = e.what();
      }
    }
    tp.comm(0).barrier();
  }
  detail::agree_on_errors(tp, error, "reading the rank's shard", dir, who);
  return index;
}

}  // namespace detail

/// Loads a sharded checkpoint into the model, whatever tp size saved it: each rank reads only the boxes its
/// shard needs. Without ranks_per_step, independent on every rank (no communication). Returns the checkpoint's
/// index (step, metadata).
template <class Model, class TpMesh>
checkpoint_index load_sharded(Model& model, TpMesh const& tp, std::filesystem::path const& dir,
                              load_options const& options = {}) {
  namespace fs = std::filesystem;
  return detail::load_into(
      model, tp, dir, options, "load_sharded", [&](fs::path& source, checkpoint_index& index, std::string& label) {
        source = detail::normalized_dir(dir);
        fs::path const previous = (source.parent_path().empty() ? fs::path(".") : source.parent_path()) /
                                  ("." + source.filename().string() + ".previous");
        if (!fs::exists(source / checkpoint_index_name) && fs::exists(previous / checkpoint_index_name))
          source = previous;  // a save on a file system without RENAME_EXCHANGE died between its two renames
        index = read_checkpoint_index(source);
        label = (source / checkpoint_index_name).string();
      });
}

/// Loads one consolidated safetensors file of full tensors (from `shardwise consolidate`, or a Hugging Face
/// model.safetensors with `names` = sw::transformers_llama_name) into a parallelized model of any tp size: each
/// rank reads only its slices through the memory map. `names` maps shardwise's parameter names to the file's.
/// Returns the file's metadata.
template <class Model, class TpMesh>
std::map<std::string, std::string> load_consolidated(Model& model, TpMesh const& tp, std::filesystem::path const& file,
                                                     std::function<std::string(std::string const&)> const& names = {},
                                                     load_options const& options = {}) {
  namespace fs = std::filesystem;
  checkpoint_index found;
  detail::load_into(
      model, tp, file, options, "load_consolidated",
      [&](fs::path& source, checkpoint_index& index, std::string& label) {
        safetensors_file const f(file.string());
        source = file.parent_path().empty() ? fs::path(".") : file.parent_path();
        label = file.string();
        index.metadata.insert(f.metadata().begin(), f.metadata().end());
        // The model's names, each a single piece: the whole tensor, in this file, under the file's name for it.
        std::map<std::string, std::string> model_name_of;  // file name -> model name
        detail::for_each_checkpoint_tensor(
            model, tp.size(), tp.rank(), true, [&](detail::tensor_layout const& t, auto&) {
              std::string const stored = names ? names(t.name) : t.name;
              model_name_of[stored] = t.name;
              if (!f.contains(stored)) return;  // reported as missing by the comparison
              tensor_info const& info = f.info(stored);
              index.tensors.push_back({t.name, info.type, info.shape, "", {}});
              index.tensors.back().pieces.push_back(
                  {file.filename().string(), std::vector<std::uint64_t>(info.shape.size(), 0), info.shape, stored});
            });
        for (tensor_info const& info : f.tensors())
          if (!model_name_of.count(info.name))
            index.tensors.push_back({info.name, info.type, info.shape, "", {}});  // reported as not in the model
        found.metadata = index.metadata;
      });
  return found.metadata;
}

/// Fills a lazily declared, parallelized model: each rank allocates and reads only its shard. Returns the
/// model, now usable.
template <module Model, class TpMesh>
Model& load_sharded(Lazy<Model>& lazy, TpMesh const& tp, std::filesystem::path const& dir,
                    load_options const& options = {}) {
  (void)load_sharded(lazy.unmaterialized(), tp, dir, options);
  return lazy.unmaterialized();
}

/// Fills a lazily declared, parallelized model from a consolidated file: each rank allocates and reads only its
/// shard. Returns the model, now usable.
template <module Model, class TpMesh>
Model& load_consolidated(Lazy<Model>& lazy, TpMesh const& tp, std::filesystem::path const& file,
                         std::function<std::string(std::string const&)> const& names = {},
                         load_options const& options = {}) {
  (void)load_consolidated(lazy.unmaterialized(), tp, file, names, options);
  return lazy.unmaterialized();
}

}  // namespace shardwise
