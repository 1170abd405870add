#pragma once
// Consolidation: a sharded checkpoint (save_sharded) into one model.safetensors of full tensors that any
// safetensors reader opens — what `shardwise consolidate` runs. Tensors are assembled and written one at a time
// from the memory-mapped rank files, so the memory needed is that of the largest tensor.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/safetensors_write.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/tensor/box.hpp"

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
  /// Renames tensors on the way (for example to Hugging Face transformers' names); identity when empty.
  std::function<std::string(std::string const&)> rename;
  /// Called before each tensor is written: how many were written before, the count, its name and its bytes.
  std::function<void(std::size_t, std::size_t, std::string const&, std::uint64_t)> progress;
};

/// Writes every tensor of the sharded checkpoint at `checkpoint` whole into `output` (a safetensors file,
/// replaced atomically), but optimizer state saved beside them, with the checkpoint's metadata, its step and "format":
/// "pt". Returns its index.
inline checkpoint_index consolidate(std::filesystem::path const& checkpoint, std::filesystem::path const& output,
                                    consolidate_options const& options = {}) {
  namespace fs = std::filesystem;
  fs::path const dir = find_checkpoint_folder(checkpoint);
  checkpoint_index const index = read_checkpoint_index(dir);
  std::map<std::string, std::unique_ptr<safetensors_file>> files;
  auto const weights = [&] {  // the optimizer state a checkpoint may hold beside them is not the model's
    std::vector<checkpoint_tensor const*> list;
    for (auto const& t : index.tensors)
      if (!t.name.starts_with(optimizer_state_prefix)) list.push_back(&t);
    return list;
  }();
  for (auto const* t : weights)
    for (auto const& p : t->pieces)
      if (!files.count(p.file)) {
        if (!fs::exists(dir / p.file))
          detail::fail("shardwise::consolidate: \"", (dir / p.file).string(), "\" is missing (tensor \"", t->name,
                       "\" has a piece there): the rank folder \"", fs::path(p.file).parent_path().string(),
                       "\" is gone; restore it");
        files[p.file] = std::make_unique<safetensors_file>((dir / p.file).string());
      }

  safetensors_writer writer;
  std::size_t written = 0;  // in the order of the file (by element size, then name)
  for (auto const* weight : weights) {
    checkpoint_tensor const& t = *weight;
    std::string const name = options.rename ? options.rename(t.name) : t.name;
    if (t.shape.size() > max_rank)
      detail::fail("shardwise::consolidate: tensor \"", t.name, "\" has more than ", max_rank, " dimensions");
    writer.add_deferred(name, t.type, t.shape, [&, name](std::span<std::byte> out) {
      if (options.progress) options.progress(written++, weights.size(), name, out.size());
      std::size_t const element = dtype_size(t.type);
      extents full;
      full.rank = t.shape.size();
      for (std::size_t d = 0; d < full.rank; ++d) full[d] = static_cast<std::size_t>(t.shape[d]);
      for (auto const& p : t.pieces) {
        safetensors_file const& file = *files.at(p.file);
        tensor_info const& info = file.info(t.name);
        if (info.shape != p.shape || info.type != t.type)
          detail::fail("shardwise::consolidate: \"", file.path(), "\": tensor \"", t.name, "\" is ",
                       dtype_name(info.type), " ", detail::shape_text(info.shape), " but the index says ",
                       dtype_name(t.type), " ", detail::shape_text(p.shape), "; the checkpoint is corrupt");
        extents size, offset;
        size.rank = offset.rank = full.rank;
        for (std::size_t d = 0; d < full.rank; ++d) {
          size[d] = static_cast<std::size_t>(p.shape[d]);
          offset[d] = static_cast<std::size_t>(p.offset[d]);
        }
        file.will_need(t.name);
        detail::for_each_run(full, offset, size, detail::zero_offset(full.rank), size, storage_order::row_major,
                             [&](std::size_t to, std::size_t from, std::size_t n) {
                               file.read_bytes(t.name, from * element, n * element, out.data() + to * element);
                             });
      }
    });
  }
  std::map<std::string, std::string> metadata(index.metadata.begin(), index.metadata.end());
  metadata["format"] = "pt";
  metadata["shardwise.step"] = std::to_string(index.step);
  writer.write(output, metadata);
  return index;
}

}  // namespace shardwise
