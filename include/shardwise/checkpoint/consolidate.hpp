#pragma once
// Consolidation: a sharded checkpoint (save_sharded) into one model.safetensors of full tensors that any
// safetensors reader opens — what `shardwise consolidate` runs. Tensors are assembled and written one at a time
// from the memory-mapped rank files, so the memory needed is that of the largest tensor.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/export_layout.hpp"
#include "shardwise/checkpoint/file_checks.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/safetensors_write.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/tensor_mapping.hpp"
#include "shardwise/checkpoint/verify.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/tensor/box.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES  // JSON is parsed only where the entry points are compiled
#include <nlohmann/json.hpp>
#endif

namespace shardwise {

/// The checkpoint folder for `path`: the folder holding shardwise_checkpoint.json and tensor_parallel_shards,
/// or the tensor_parallel_shards folder itself (as optimum-cli accepts both).
[[nodiscard]] inline std::filesystem::path find_checkpoint_folder(std::filesystem::path const& path) {
  namespace fs = std::filesystem;
  fs::path p = path.lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (fs::exists(p / checkpoint_index_name)) return p;
  if (p.filename() == "tensor_parallel_shards" && fs::exists(p.parent_path() / checkpoint_index_name))
    return p.parent_path();
  detail::fail("shardwise::consolidate: \"", path.string(), "\" holds no ", checkpoint_index_name,
               " (nor does its parent); give the folder save_sharded wrote, or its tensor_parallel_shards folder");
}

/// Options of consolidate.
struct consolidate_options {
  /// Where each tensor goes in the output, under another program's names (sw::transformers_llama_mapping(),
  /// sw::transformers_gpt2_mapping(dim): the mapping that loads that program's files); shardwise's names, each
  /// tensor as stored, when empty. A mapped tensor may be stored transposed, or as a slice of a fused tensor whose
  /// slices the mapping must cover exactly.
  checkpoint_mapping mapping;
  /// Called before each tensor is written: how many were written before, the count, its name and its bytes.
  std::function<void(std::size_t, std::size_t, std::string const&, std::uint64_t)> progress;
};

namespace detail {

/// An output inside the checkpoint folder (or equal to it) would be deleted by the next save there: refused.
inline void check_output_outside(std::filesystem::path const& dir, std::filesystem::path const& output) {
  namespace fs = std::filesystem;
  fs::path const folder = fs::weakly_canonical(dir), out = fs::weakly_canonical(output);
  if (std::mismatch(folder.begin(), folder.end(), out.begin(), out.end()).first == folder.end())
    fail("shardwise::consolidate: the output \"", output.string(), "\" is inside the checkpoint \"", dir.string(),
         "\", which the next save there replaces (and the consolidated file with it); write it elsewhere");
}

/// The rank files the weights' pieces lie in, each opened once and refused unless it belongs to the save the
/// index describes.
inline std::map<std::string, std::unique_ptr<safetensors_file>> open_rank_files(
    std::filesystem::path const& dir, checkpoint_index const& index,
    std::vector<checkpoint_tensor const*> const& weights) {
  std::map<std::string, std::unique_ptr<safetensors_file>> files;
  for (auto const* t : weights)
    for (auto const& p : t->pieces) {
      if (files.count(p.file)) continue;
      if (!std::filesystem::exists(dir / p.file))
        fail("shardwise::consolidate: \"", (dir / p.file).string(), "\" is missing (tensor \"", t->name,
             "\" has a piece there): the rank folder \"", std::filesystem::path(p.file).parent_path().string(),
             "\" is gone; restore it");
      auto file = std::make_unique<safetensors_file>((dir / p.file).string());
      if (!same_save(*file, index))
        fail("shardwise::consolidate: \"", file->path(), "\" belongs to another save than the index (generation ",
             generation_of(*file), ", the index's ", hex64(index.generation),
             "): the folder mixes two saves; consolidate a whole save (run `shardwise verify` on it)");
      files[p.file] = std::move(file);
    }
  return files;
}

/// The piece of tensor t in `file`, checked before it is copied: its shape and dtype against the index's, its
/// bytes against the checksum its save recorded, so that damage is not laundered into a clean-looking file.
inline void check_piece(safetensors_file const& file, checkpoint_tensor const& t, checkpoint_piece const& p) {
  tensor_info const& info = file.info(t.name);
  if (info.shape != p.shape || info.type != t.type)
    fail("shardwise::consolidate: \"", file.path(), "\": tensor \"", t.name, "\" is ", dtype_name(info.type), " ",
         shape_text(info.shape), " but the index says ", dtype_name(t.type), " ", shape_text(p.shape),
         "; the checkpoint is corrupt");
  if (p.checksum.empty()) return;  // saved before checksums existed
  if (std::string const now = checksum_now(file, t.name); now != p.checksum)
    fail("shardwise::consolidate: \"", file.path(), "\": tensor \"", t.name,
         "\" does not match the checksum its save recorded (", p.checksum, ", now ", now,
         "): the file is damaged and nothing was written; restore it, or consolidate another checkpoint");
}

/// Copies tensor t's pieces from their rank files into `out`, its whole row-major bytes.
inline void assemble_tensor(checkpoint_tensor const& t,
                            std::map<std::string, std::unique_ptr<safetensors_file>> const& files,
                            std::span<std::byte> out) {
  std::size_t const element = dtype_size(t.type);
  extents full;
  full.rank = t.shape.size();
  for (std::size_t d = 0; d < full.rank; ++d) full[d] = static_cast<std::size_t>(t.shape[d]);
  for (auto const& p : t.pieces) {
    safetensors_file const& file = *files.at(p.file);
    file.will_need(t.name);  // read ahead before the checksum's pass, which is the first to touch the piece
    check_piece(file, t, p);
    extents size, offset;
    size.rank = offset.rank = full.rank;
    for (std::size_t d = 0; d < full.rank; ++d) {
      size[d] = static_cast<std::size_t>(p.shape[d]);
      offset[d] = static_cast<std::size_t>(p.offset[d]);
    }
    for_each_run(full, offset, size, zero_offset(full.rank), size, storage_order::row_major,
                 [&](std::size_t to, std::size_t from, std::size_t n) {
                   file.read_bytes(t.name, from * element, n * element, out.data() + to * element);
                 });
  }
}

}  // namespace detail

/// Writes every tensor of the sharded checkpoint at `checkpoint` whole into `output` (a safetensors file,
/// replaced atomically; its folder is created), but optimizer state saved beside them. Every piece is checked
/// against the checksum its save recorded and every rank file against the index's generation before it is
/// copied: a damaged checkpoint is an error naming the file and the tensor, and nothing is written. The file's
/// metadata: the checkpoint's, "format": "pt", "shardwise.step", the model's configuration (config_metadata_key)
/// and each tensor's checksum (checksums_metadata_key), which load_consolidated and `shardwise verify` check.
/// An output inside the checkpoint folder is refused. Returns the checkpoint's index.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY checkpoint_index consolidate(std::filesystem::path const& checkpoint,
                                                               std::filesystem::path const& output,
                                                               consolidate_options const& options = {});
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY checkpoint_index consolidate(std::filesystem::path const& checkpoint,
                                                               std::filesystem::path const& output,
                                                               consolidate_options const& options) {
  namespace fs = std::filesystem;
  fs::path const dir = find_checkpoint_folder(checkpoint);
  detail::check_output_outside(dir, output);
  checkpoint_index const index = read_checkpoint_index(dir);
  std::vector<checkpoint_tensor const*> weights;  // the optimizer state a checkpoint may hold is not the model's
  for (auto const& t : index.tensors)
    if (!t.name.starts_with(optimizer_state_prefix)) weights.push_back(&t);
  auto const files = detail::open_rank_files(dir, index, weights);

  for (auto const* t : weights)
    if (t->shape.size() > max_rank)
      detail::fail("shardwise::consolidate: tensor \"", t->name, "\" has more than ", max_rank, " dimensions");
  checkpoint_mapping const same_names = [](std::string const& name) { return tensor_source{name}; };
  auto const outputs = detail::plan_export(weights, options.mapping ? options.mapping : same_names);
  safetensors_writer writer;
  std::size_t written = 0;  // in the order of the file (by element size, then name)
  for (auto const& o : outputs)
    writer.add_deferred(o.name, o.type, o.file_shape(), [&](std::span<std::byte> out) {
      if (options.progress) options.progress(written++, outputs.size(), o.name, out.size());
      if (o.as_stored()) return detail::assemble_tensor(*o.members[0].tensor, files, out);
      for (auto const& m : o.members) {  // transposed or fused: each assembled apart, then put in its place
        std::size_t elements = 1;
        for (auto const n : m.tensor->shape) elements *= static_cast<std::size_t>(n);
        std::vector<std::byte> member(elements * dtype_size(o.type));
        detail::assemble_tensor(*m.tensor, files, member);
        detail::place_export_member(o, m, member, out);
      }
    });
  std::map<std::string, std::string> metadata(index.metadata.begin(), index.metadata.end());
  metadata["format"] = "pt";
  metadata["shardwise.step"] = std::to_string(index.step);
  if (!index.config.empty()) metadata[config_metadata_key] = nlohmann::json(index.config).dump();
  if (output.has_parent_path()) fs::create_directories(output.parent_path());
  writer.write(output, metadata, checksums_metadata_key);
  return index;
}
#endif

}  // namespace shardwise
