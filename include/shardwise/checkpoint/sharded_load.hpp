#pragma once
// Loading sharded checkpoints into a parallelized (or lazily declared) model, resharded to its tp size:
// load_sharded, load_options, and the loader that load_consolidated and load_pretrained
// (checkpoint/pretrained.hpp) share. See checkpoint/sharded.hpp.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/checksum.hpp"
#include "shardwise/checkpoint/relay.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/checkpoint/verify.hpp"
#include "shardwise/collectives/collectives.hpp"
#include "shardwise/nn/lazy.hpp"

namespace shardwise {
/// Options of load_sharded, load_consolidated and load_pretrained.
struct load_options {
  /// How many tp ranks read at once (optimum-neuron's num_local_ranks_per_step): the others wait their turn,
  /// which bounds the concurrent disk and page-cache load. 0: all at once, with no communication at all.
  int ranks_per_step = 0;
  /// The RAM-efficient mode: only tp rank 0 opens the files; it reads one tensor at a time and sends every
  /// other rank its shard over the mesh (the others never touch the disk nor hold more than their shard).
  bool only_rank0_reads = false;
  /// Strict (transformers' load_state_dict(strict=True)): a model tensor the checkpoint lacks, or a checkpoint
  /// tensor no model tensor reads, is an error naming it. Non-strict: such tensors are skipped — a missing one
  /// keeps its current value (zeros in a sw::Lazy model) — and load_pretrained reports them.
  bool strict = true;
  /// Check every piece a rank reads against the checksum its save recorded (the piece is read whole once for
  /// that); off: only the boxes the rank needs are read.
  bool verify_checksums = true;
};

namespace detail {

/// A file of the checkpoint belongs to another save than the index read first: a save replaced the folder
/// while it was read. load_sharded reads it again.
class checkpoint_changed : public error {
 public:
  using error::error;
};

/// The generation in dir's index, or 0 if it cannot be read.
inline std::uint64_t current_generation(std::filesystem::path const& dir) {
  try {
    return read_checkpoint_index(dir).generation;
  } catch (std::exception const&) {
    return 0;
  }
}

/// Reads rows [rows.first, rows.second) x columns [cols.first, cols.second) of a tensor that `file` stores
/// transposed (GPT-2's Conv1D: [in, out]), so as file rows [cols) x file columns [rows), into `out`: the
/// block's first row, rows `stride` apart, starting at column `col`. A box of at most load_staging_bytes is read
/// at a time, then transposed into place, so a rank still reads only its block.
template <class T>
void read_transposed(safetensors_file const& file, std::string const& name, std::pair<std::size_t, std::size_t> rows,
                     std::pair<std::size_t, std::size_t> cols, T* out, std::size_t stride, std::size_t col,
                     std::vector<T>& box) {
  std::size_t const budget = std::max<std::size_t>(1, load_staging_bytes / sizeof(T));
  std::size_t const rows_per_read = std::min(rows.second - rows.first, budget);  // a file row's run
  std::size_t const cols_per_read = std::max<std::size_t>(1, budget / std::max<std::size_t>(1, rows_per_read));
  for (std::size_t r0 = rows.first; r0 < rows.second; r0 += rows_per_read) {
    std::size_t const r1 = std::min(rows.second, r0 + rows_per_read);
    for (std::size_t c0 = cols.first; c0 < cols.second; c0 += cols_per_read) {
      std::size_t const c1 = std::min(cols.second, c0 + cols_per_read);
      box.resize((c1 - c0) * (r1 - r0));
      file.read_box(name, extents{c0, r0}, extents{c1 - c0, r1 - r0}, box.data());
      for (std::size_t r = r0; r < r1; ++r)  // written along the parameter's rows, read down the box's columns
        for (std::size_t c = c0; c < c1; ++c)
          out[(r - rows.first) * stride + col + (c - cols.first)] = box[(c - c0) * (r1 - r0) + (r - r0)];
    }
  }
}

/// What load_into found: the index it read, and (non-strict) the model tensors it left as they were and the
/// checkpoint tensors it did not read.
struct load_outcome {
  checkpoint_index index;
  std::vector<std::string> missing, unexpected;
};

/// The loader behind load_sharded, load_consolidated and load_pretrained: locate(source, index, label,
/// unexpected) finds the checkpoint (the folder its pieces' files are relative to, the index, the file to name
/// in errors, and the file's tensors it leaves unread); then the model and the index are compared and each rank
/// reads the boxes its shard needs.
template <class Model, class TpMesh, class Locate>
load_outcome load_into(Model& model, TpMesh const& tp, std::filesystem::path const& dir, load_options const& options,
                       std::string_view who, Locate&& locate) {
  namespace fs = std::filesystem;
  int const size = tp.size(), rank = tp.rank();
  constexpr bool fsdp = requires { model.data_mesh(); };  // a model under FSDP: its shards span dp x tp
  bool const fsdp_rank0_reads = [&] {
    if constexpr (fsdp)
      return options.only_rank0_reads &&
             with_fsdp_axes(model, tp, [](auto const&... axes) { return (1 * ... * axes.size()); }) > 1;
    else
      return false;
  }();
  bool const rank0_reads = !fsdp && options.only_rank0_reads && size > 1;
  bool const in_turns = !rank0_reads && options.ranks_per_step > 0 && options.ranks_per_step < size;
  fs::path source;
  load_outcome outcome;
  checkpoint_index& index = outcome.index;
  std::string index_file;
  auto const check = [&] {
    outcome.missing.clear();
    outcome.unexpected.clear();
    locate(source, index, index_file, outcome.unexpected);

    // The model and the checkpoint must hold the same tensors (unless non-strict) with the same global shapes.
    std::set<std::string> in_model;
    detail::for_each_checkpoint_tensor(model, size, rank, true, [&](detail::tensor_layout const& t, auto&) {
      in_model.insert(t.name);
      checkpoint_tensor const* c = index.find(t.name);
      if (!c && !options.strict) {
        outcome.missing.push_back(t.name);
        return;
      }
      if (!c)
        detail::fail("shardwise::", who, ": \"", index_file, "\": the model's tensor \"", t.name,
                     "\" is not in the checkpoint; load a checkpoint saved from this model, or pass "
                     "load_options{.strict = false} to keep its current value");
      if (c->shape != t.stored_shape())
        detail::fail("shardwise::", who, ": \"", index_file, "\": tensor \"", t.name, "\" has shape ",
                     detail::shape_text(c->shape), " in the checkpoint but ", detail::shape_text(t.stored_shape()),
                     " in the model; load a checkpoint of the same model configuration");
      if (!is_floating(c->type))
        detail::fail("shardwise::", who, ": \"", index_file, "\": tensor \"", t.name, "\" is stored as ",
                     dtype_name(c->type), ", not a floating type; load a checkpoint of this model");
    });
    for (auto const& c : index.tensors) {
      if (in_model.count(c.name) || c.name.starts_with(optimizer_state_prefix)) continue;
      if constexpr (requires { model.shardwise_other_stage(c.name); })
        if (model.shardwise_other_stage(c.name)) continue;  // a pipeline stage reads only its own tensors
      if (options.strict)
        detail::fail("shardwise::", who, ": \"", index_file, "\": the checkpoint's tensor \"", c.name,
                     "\" is not in the model; load the checkpoint into the model it was saved from, or pass "
                     "load_options{.strict = false} to skip it");
      outcome.unexpected.push_back(c.name);
    }
    // A model that states its configuration must have the checkpoint's: the same shapes can mean other weights.
    if constexpr (requires { model.shardwise_config(); }) {
      for (auto const& [field, value] : model.shardwise_config()) {
        auto const saved = index.config.find(field);
        if (saved != index.config.end() && saved->second != value)
          detail::fail("shardwise::", who, ": \"", index_file, "\": the checkpoint was saved from a model with ", field,
                       " = ", saved->second, " but this model has ", field, " = ", value,
                       "; build the model with the checkpoint's configuration");
      }
    }
    for (auto const& c : index.tensors)
      for (auto const& p : c.pieces)
        if (!fs::exists(source / p.file))
          detail::fail("shardwise::", who, ": \"", (source / p.file).string(), "\" is missing (tensor \"", c.name,
                       "\" has a piece there): the rank folder \"", fs::path(p.file).parent_path().string(),
                       "\" is gone; restore it, or load another checkpoint");
  };
  if constexpr (fsdp) {
    if (fsdp_rank0_reads) {  // every rank must reach the relay that follows: errors are agreed on first
      std::string error;
      try {
        check();
      } catch (std::exception const& e) {
        error = e.what();
      }
      with_fsdp_axes(model, tp, [&](auto const&... axes) {
        agree_on_errors_across(error, "checking the checkpoint against the model", dir, who, axes...);
      });
    } else {
      check();
    }
  } else if constexpr (!requires { tp.comm(0); }) {  // one tp rank: no turns
    check();
  } else if (!in_turns && !rank0_reads) {
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
  std::set<std::string> verified;                                  // "file\ntensor" checked against its checksum
  // A rank file of another save than the index (a save replaced the folder meanwhile) is refused.
  auto const open_piece_file = [&](std::filesystem::path const& path) {
    auto file = std::make_unique<safetensors_file>(path.string());
    if (!same_save(*file, index)) {
      throw checkpoint_changed(concat("shardwise::", who, ": \"", path.string(),
                                      "\" belongs to another save than the index; a save replaced the checkpoint "
                                      "while it was read"));
    }
    return file;
  };
  auto const check_piece = [&](safetensors_file const& file, std::string const& name, std::string const& stored) {
    std::string const computed = checksum_now(file, name);
    if (computed != stored)
      detail::fail("shardwise::", who, ": \"", file.path(), "\": tensor \"", name,
                   "\" does not match the checksum its save recorded (", stored, ", now ", computed,
                   "): the file is damaged; restore it or load another checkpoint, and run `shardwise verify` on the "
                   "folder");
  };
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
        if (!file) file = open_piece_file(source / p.file);
        std::string const& stored_name = p.name_in_file.empty() ? t.name : p.name_in_file;
        if (options.verify_checksums && !p.checksum.empty() && verified.insert(p.file + '\n' + stored_name).second)
          check_piece(*file, stored_name, p.checksum);
        bool const plain = !p.transposed && p.offset_in_file.empty();  // else checked against the mapping
        if (plain && file->info(stored_name).shape != p.shape)
          detail::fail("shardwise::", who, ": \"", file->path(), "\": tensor \"", t.name, "\" has shape ",
                       detail::shape_text(file->info(stored_name).shape), " but the index says ",
                       detail::shape_text(p.shape), "; the checkpoint is corrupt: save it again");
        // Index v of dimension d of the global tensor, in the file's tensor (in the model's orientation).
        auto const at = [&](std::size_t d, std::uint64_t v) {
          return static_cast<std::size_t>(v - p.offset[d] + (p.offset_in_file.empty() ? 0 : p.offset_in_file[d]));
        };
        auto const width = static_cast<std::size_t>(c1 - c0);
        T* const first_row = out + (run.local + (r0 - run.stored)) * t.local_cols;
        if (p.transposed) {
          detail::read_transposed(*file, stored_name, {at(0, r0), at(0, r1)}, {at(1, c0), at(1, c1)}, first_row,
                                  t.local_cols, c0 - t.col_offset, box);
          continue;
        }
        auto read_rows = [&](std::uint64_t first, std::uint64_t end, T* into) {
          extents offset{at(0, first)}, count{static_cast<std::size_t>(end - first)};
          if (!t.is_vector) {
            offset = {at(0, first), at(1, c0)};
            count = {static_cast<std::size_t>(end - first), width};
          }
          file->read_box(stored_name, offset, count, into);
        };
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
      if (!index.find(t.name)) return;  // missing (non-strict): keeps its value
      value.setZero();
      std::vector<T> box;
      read_layout(t, value.data(), box);
    });
    files.clear();  // unmap before the next ranks' turn
    if (detail::checkpoint_load_hook) detail::checkpoint_load_hook("read_end", rank);
  };
  if constexpr (fsdp) {
    if (fsdp_rank0_reads) {
      relay_shards(
          model, tp, dir, who,
          [&](tensor_layout const& theirs, auto& block, std::string& error) {
            using T = typename std::remove_cvref_t<decltype(block)>::Scalar;
            std::vector<T> box;
            try {
              read_layout(theirs, block.data(), box);
            } catch (std::exception const& e) {
              error = e.what();
            }
          },
          [&](std::string const& name) { return index.find(name) != nullptr; });
      files.clear();
      return outcome;
    }
  }
  if constexpr (!requires { tp.comm(0); }) {
    read_shard();
    return outcome;
  } else {
    if (rank0_reads) {
      // tp rank 0 reads one rank's shard of one tensor at a time, straight from the files, and sends it: it never
      // holds a whole tensor, only its own shard and the one block in flight. A block it cannot read goes out as
      // zeros, so no rank waits for one that will not come; the error is agreed on once the tensor is sent, and
      // raised on every rank.
      if (rank == 0 && detail::checkpoint_load_hook) detail::checkpoint_load_hook("read_begin", rank);
      detail::for_each_checkpoint_tensor(model, size, rank, true, [&](detail::tensor_layout const& t, auto& value) {
        using Tensor = std::remove_cvref_t<decltype(value)>;
        using T = typename Tensor::Scalar;
        if (!index.find(t.name)) return;  // missing (non-strict): skipped alike on every rank
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
      return outcome;
    }
    if (!in_turns) {
      read_shard();
      return outcome;
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
    return outcome;
  }
}

}  // namespace detail

namespace detail {
/// load_sharded with the layouts of tp (a mesh, or single_stage) and its outcome agreed over `agreeing` (every
/// axis whose ranks load together: tp, and FSDP's dp).
template <class Model, class TpMesh, class... Agreeing>
checkpoint_index load_sharded_agreed(Model& model, TpMesh const& tp, std::filesystem::path const& dir,
                                     load_options const& options, Agreeing const&... agreeing) {
  namespace fs = std::filesystem;
  auto const locate = [&](fs::path& source, checkpoint_index& index, std::string& label, std::vector<std::string>&) {
    source = detail::normalized_dir(dir);
    fs::path const previous = (source.parent_path().empty() ? fs::path(".") : source.parent_path()) /
                              ("." + source.filename().string() + ".previous");
    if (!fs::exists(source / checkpoint_index_name) && fs::exists(previous / checkpoint_index_name))
      source = previous;  // a save on a file system without RENAME_EXCHANGE died between its two renames
    index = read_checkpoint_index(source);
    label = (source / checkpoint_index_name).string();
  };
  constexpr int attempts = 50;
  for (int attempt = 1;; ++attempt) {
    std::uint64_t const before = detail::current_generation(detail::normalized_dir(dir));
    std::string error;
    int status = 0;  // 0 read, 1 the folder changed under this rank, 2 failed
    checkpoint_index index;
    try {
      index = detail::load_into(model, tp, dir, options, "load_sharded", locate).index;
    } catch (detail::checkpoint_changed const& e) {
      status = 1, error = e.what();
    } catch (std::exception const& e) {
      // A file a save removed while this rank read it looks like a damaged checkpoint: look again.
      status = detail::current_generation(detail::normalized_dir(dir)) != before ? 1 : 2;
      error = e.what();
    }
    // Every rank must have read the same save: its generation, agreed across the ranks.
    int worst = status;
    std::uint64_t newest = status == 0 ? index.generation : 0;
    std::uint64_t oldest = status == 0 ? index.generation : ~std::uint64_t{0};
    ((worst = all_reduce(agreeing, worst, Max{}), newest = all_reduce(agreeing, newest, Max{}),
      oldest = all_reduce(agreeing, oldest, Min{})),
     ...);
    if (worst == 0 && newest == oldest) return index;
    auto const agree = [&](std::string const& message) {
      agree_on_errors_across(message, "reading the checkpoint", dir, "load_sharded", agreeing...);
    };
    if (worst == 2 || attempt == attempts) agree(status == 0 ? std::string() : error);
    bool const first = ((agreeing.rank() == 0) && ...);
    if (worst < 2 && attempt == attempts)
      agree(first ? std::string("shardwise::load_sharded: \"") + dir.string() +
                        "\" was replaced by other saves during 50 reads in a row"
                  : std::string());
  }
}
}  // namespace detail

/// Loads a sharded checkpoint into the model, whatever tp size saved it: each rank reads only the boxes its
/// shard needs, and checks them against the checksums of the save (load_options::verify_checksums). A save
/// that replaces the folder meanwhile is noticed (every rank file carries its save's generation) and the load
/// starts again, so every rank ends with the data of one and the same save. Returns the checkpoint's index
/// (step, metadata).
template <class Model, class TpMesh>
checkpoint_index load_sharded(Model& model, TpMesh const& tp, std::filesystem::path const& dir,
                              load_options const& options = {}) {
  return detail::load_sharded_agreed(model, tp, dir, options, tp);
}

/// Fills a lazily declared, parallelized model: each rank allocates and reads only its shard. Returns the
/// model, now usable.
template <module Model, class TpMesh>
Model& load_sharded(Lazy<Model>& lazy, TpMesh const& tp, std::filesystem::path const& dir,
                    load_options const& options = {}) {
  (void)load_sharded(lazy.unmaterialized(), tp, dir, options);
  return lazy.unmaterialized();
}

}  // namespace shardwise
