#pragma once
// Loading sharded and consolidated checkpoints into a parallelized (or lazily declared) model, resharded to
// its tp size: load_sharded, load_consolidated and their load_options. See checkpoint/sharded.hpp.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/collectives/collectives.hpp"
#include "shardwise/nn/lazy.hpp"

namespace shardwise {
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
