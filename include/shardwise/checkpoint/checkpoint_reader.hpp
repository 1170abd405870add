#pragma once
// Reading a rank's part of a checkpoint's tensors straight from the pieces' files: the half of the loader
// (checkpoint/sharded_load.hpp) that does not depend on the model, so it is compiled once per element type.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/checksum.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/model_tensors.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/checkpoint/verify.hpp"

namespace shardwise::detail {

/// A file of the checkpoint belongs to another save than the index read first: a save replaced the folder
/// while it was read. load_sharded reads it again.
class checkpoint_changed : public error {
 public:
  using error::error;
};

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

/// Index v of dimension d of the global tensor, in the piece's copy in its file (in the model's orientation).
inline std::size_t index_in_file(checkpoint_piece const& p, std::size_t d, std::uint64_t v) {
  return static_cast<std::size_t>(v - p.offset[d] + (p.offset_in_file.empty() ? 0 : p.offset_in_file[d]));
}

/// Reads the parts of a checkpoint's tensors that tensor layouts describe, straight from the pieces' files. Each
/// file is opened on first use and refused if it belongs to another save than the index; each piece a read
/// touches is checked against its save's checksum once (when asked).
class checkpoint_reader {
 public:
  /// A reader of the checkpoint in `source` described by `index`; `who` ("load_sharded") names it in errors.
  checkpoint_reader(std::filesystem::path source, checkpoint_index const& index, std::string_view who,
                    bool verify_checksums)
      : source_(std::move(source)), index_(&index), who_(who), verify_checksums_(verify_checksums) {}

  /// Reads the part of tensor t that layout t describes (a rank's shard) into `out` (zeroed by the caller: rows
  /// the checkpoint does not hold, vocabulary padding, stay zero). `box` is staging room, reused across calls.
  template <class T>
  void read(tensor_layout const& t, T* out, std::vector<T>& box) {
    checkpoint_tensor const& c = *index_->find(t.name);
    for (auto const& run : row_runs(t, false))
      for (auto const& p : c.pieces) read_piece(t, run, p, out, box);
  }

  /// read() into values of any floating type.
  void read(tensor_layout const& t, tensor_values const& out);

  /// Unmaps the files opened so far (before the next ranks' turn).
  void close() { files_.clear(); }

 private:
  /// Rows [first, end) x columns [c0, c1) of a piece: the part of one run of t's rows that the piece holds.
  struct piece_part {
    std::uint64_t first, end, c0, c1;
  };

  template <class T>
  void read_piece(tensor_layout const& t, row_run const& run, checkpoint_piece const& p, T* out, std::vector<T>& box);
  safetensors_file& file_of(checkpoint_piece const& p, std::string const& stored_name, tensor_layout const& t);
  template <class T>
  void read_columns(safetensors_file const& file, std::string const& stored_name, tensor_layout const& t,
                    checkpoint_piece const& p, piece_part part, T* first_row, std::vector<T>& box);

  std::filesystem::path source_;
  checkpoint_index const* index_;
  std::string_view who_;
  bool verify_checksums_;
  std::map<std::string, std::unique_ptr<safetensors_file>> files_;  // opened on first use
  std::set<std::string> verified_;                                  // "file\ntensor" checked against its checksum
};

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void checkpoint_reader::read(tensor_layout const& t, tensor_values const& out) {
  with_floating_type(out.type, [&](auto zero) {
    using E = decltype(zero);
    std::vector<E> box;
    read(t, reinterpret_cast<E*>(out.data), box);
  });
}
#endif

/// The piece's file, opened on first use (and refused if another save wrote it), its copy of the tensor checked
/// against the save's checksum once, and its shape against the index's.
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY safetensors_file& checkpoint_reader::file_of(checkpoint_piece const& p,
                                                                               std::string const& stored_name,
                                                                               tensor_layout const& t) {
  auto& file = files_[p.file];
  if (!file) {
    auto const path = source_ / p.file;
    file = std::make_unique<safetensors_file>(path.string());
    if (!same_save(*file, *index_))
      throw checkpoint_changed(concat("shardwise::", who_, ": \"", path.string(),
                                      "\" belongs to another save than the index; a save replaced the checkpoint "
                                      "while it was read"));
  }
  if (verify_checksums_ && !p.checksum.empty() && verified_.insert(p.file + '\n' + stored_name).second) {
    std::string const computed = checksum_now(*file, stored_name);
    if (computed != p.checksum)
      fail("shardwise::", who_, ": \"", file->path(), "\": tensor \"", stored_name,
           "\" does not match the checksum its save recorded (", p.checksum, ", now ", computed,
           "): the file is damaged; restore it or load another checkpoint, and run `shardwise verify` on the folder");
  }
  bool const plain = !p.transposed && p.offset_in_file.empty() && p.stacked_index == -1;  // else by the mapping
  if (plain && file->info(stored_name).shape != p.shape)
    fail("shardwise::", who_, ": \"", file->path(), "\": tensor \"", t.name, "\" has shape ",
         shape_text(file->info(stored_name).shape), " but the index says ", shape_text(p.shape),
         "; the checkpoint is corrupt: save it again");
  return *file;
}
#endif

/// The piece's part of rows [run.stored, + count) x columns [col_offset, + local_cols), read into its place.
template <class T>
void checkpoint_reader::read_piece(tensor_layout const& t, row_run const& run, checkpoint_piece const& p, T* out,
                                   std::vector<T>& box) {
  piece_part const part{
      std::max<std::uint64_t>(run.stored, p.offset[0]),
      std::min<std::uint64_t>(run.stored + run.count, p.offset[0] + p.shape[0]),
      t.is_vector ? 0 : std::max<std::uint64_t>(t.col_offset, p.offset[1]),
      t.is_vector ? 1 : std::min<std::uint64_t>(t.col_offset + t.local_cols, p.offset[1] + p.shape[1])};
  if (part.first >= part.end || part.c0 >= part.c1) return;
  std::string const& stored_name = p.name_in_file.empty() ? t.name : p.name_in_file;
  safetensors_file& file = file_of(p, stored_name, t);
  T* const first_row = out + (run.local + (part.first - run.stored)) * t.local_cols;
  if (p.transposed) {
    auto const at = [&](std::size_t d, std::uint64_t v) { return index_in_file(p, d, v); };
    read_transposed(file, stored_name, {at(0, part.first), at(0, part.end)}, {at(1, part.c0), at(1, part.c1)},
                    first_row, t.local_cols, part.c0 - t.col_offset, box);
    return;
  }
  read_columns(file, stored_name, t, p, part, first_row, box);
}

/// Reads a piece's part that the file stores in the model's orientation: whole local rows straight into the
/// parameter; part of each row (a column-cut tensor) staged a few MiB of rows at a time, so that the load holds
/// little more than the parameters.
template <class T>
void checkpoint_reader::read_columns(safetensors_file const& file, std::string const& stored_name,
                                     tensor_layout const& t, checkpoint_piece const& p, piece_part part, T* first_row,
                                     std::vector<T>& box) {
  auto const at = [&](std::size_t d, std::uint64_t v) { return index_in_file(p, d, v); };
  auto const width = static_cast<std::size_t>(part.c1 - part.c0);
  auto const read_rows = [&](std::uint64_t first, std::uint64_t end, T* into) {
    extents offset{at(0, first)}, count{static_cast<std::size_t>(end - first)};
    if (!t.is_vector) {
      offset = {at(0, first), at(1, part.c0)};
      count = {static_cast<std::size_t>(end - first), width};
    }
    if (p.stacked_index != -1) {  // the model tensor is the file tensor's [stacked_index]: one more dimension first
      for (std::size_t d = offset.rank; d-- > 0;) offset[d + 1] = offset[d], count[d + 1] = count[d];
      offset[0] = static_cast<std::size_t>(p.stacked_index), count[0] = 1, ++offset.rank, ++count.rank;
    }
    file.read_box(stored_name, offset, count, into);
  };
  if (width == t.local_cols) {
    read_rows(part.first, part.end, first_row);
    return;
  }
  std::uint64_t const rows_per_read = std::max<std::uint64_t>(1, load_staging_bytes / (width * sizeof(T)));
  box.resize(static_cast<std::size_t>(std::min<std::uint64_t>(rows_per_read, part.end - part.first)) * width);
  for (std::uint64_t first = part.first; first < part.end; first += rows_per_read) {
    std::uint64_t const end = std::min(part.end, first + rows_per_read);
    read_rows(first, end, box.data());
    for (std::uint64_t r = first; r < end; ++r)
      std::memcpy(first_row + (r - part.first) * t.local_cols + (part.c0 - t.col_offset),
                  box.data() + (r - first) * width, width * sizeof(T));
  }
}

}  // namespace shardwise::detail
