#pragma once
// Checking a sharded checkpoint without a model: every rank file opens and parses, belongs to the same save as
// the index (its generation), holds each piece the index lists with the listed shape and dtype, and — when
// asked — still matches the checksum its save recorded. `shardwise inspect` runs the first checks,
// `shardwise verify` all of them.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "shardwise/checkpoint/checksum.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"

namespace shardwise {

namespace detail {
/// The generation a rank file says it belongs to ("none" if it carries none).
inline std::string generation_of(safetensors_file const& file) {
  auto const g = file.metadata().find("shardwise.generation");
  return g == file.metadata().end() ? std::string("none") : g->second;
}
/// Whether a rank file belongs to the save the index describes (always, for an index without a generation).
inline bool same_save(safetensors_file const& file, checkpoint_index const& index) {
  return index.generation == 0 || generation_of(file) == hex64(index.generation);
}
/// The checksum of tensor `name`'s bytes in `file` as they are now, as the index records it. The pages it read
/// are released after it (a load that checks every tensor would otherwise keep the whole file resident).
inline std::string checksum_now(safetensors_file const& file, std::string_view name) {
  std::string sum = hex64(checksum64(file.raw(name)));
  file.release(name);
  return sum;
}
}  // namespace detail

/// The problems found in the sharded checkpoint in `dir` (empty: none), one sentence each, naming the file and
/// the tensor. `checksums`: also read every piece whole and compare it with its recorded checksum.
[[nodiscard]] inline std::vector<std::string> verify_checkpoint(std::filesystem::path const& dir, bool checksums) {
  checkpoint_index const index = read_checkpoint_index(dir);
  std::vector<std::string> problems;
  std::map<std::string, std::unique_ptr<safetensors_file>> files;
  std::map<std::string, bool> unreadable;
  for (auto const& t : index.tensors) {
    for (auto const& p : t.pieces) {
      std::string const path = (dir / p.file).string();
      auto& file = files[p.file];
      if (!file && !unreadable[p.file]) {
        try {
          file = std::make_unique<safetensors_file>(path);
          if (!detail::same_save(*file, index))
            problems.push_back(detail::concat("\"", path, "\" belongs to another save than the index (generation ",
                                              detail::generation_of(*file), ", the index's ",
                                              detail::hex64(index.generation), ")"));
        } catch (std::exception const& e) {
          unreadable[p.file] = true;
          problems.push_back(e.what());
        }
      }
      if (!file) continue;
      if (!file->contains(t.name)) {
        problems.push_back(detail::concat("\"", path, "\" lacks tensor \"", t.name, "\", which the index puts there"));
        continue;
      }
      tensor_info const& info = file->info(t.name);
      if (info.shape != p.shape || info.type != t.type)
        problems.push_back(detail::concat("\"", path, "\": tensor \"", t.name, "\" is ", dtype_name(info.type), ' ',
                                          detail::shape_text(info.shape), " but the index says ", dtype_name(t.type),
                                          ' ', detail::shape_text(p.shape)));
      else if (std::string now;
               checksums && !p.checksum.empty() && (now = detail::checksum_now(*file, t.name)) != p.checksum)
        problems.push_back(detail::concat("\"", path, "\": tensor \"", t.name,
                                          "\" does not match the checksum its save recorded (", p.checksum, ", now ",
                                          now, "): the file is damaged"));
    }
  }
  return problems;
}

}  // namespace shardwise
