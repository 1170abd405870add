#pragma once
// What a consolidated safetensors file carries beside its tensors so that it cannot pass for another model's or
// hide damage: the model's configuration ("shardwise.config") and a checksum per tensor ("shardwise.checksums"),
// both JSON objects of strings in the file's metadata. load_consolidated and `shardwise verify` check them when
// present; files from elsewhere (Hugging Face) carry neither and load as before.
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/checkpoint/checksum.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/core/error.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES  // JSON is parsed only where the entry points are compiled
#include "shardwise/core/bounded_json.hpp"
#endif

namespace shardwise {

/// The metadata key of a consolidated file's model configuration (a JSON object of field -> value).
inline constexpr char const* config_metadata_key = "shardwise.config";
/// The metadata key of a file's tensor checksums (a JSON object of tensor name -> 16 hex digits, checksum64).
inline constexpr char const* checksums_metadata_key = "shardwise.checksums";

namespace detail {

/// The JSON object of strings under `key` in the file's metadata (empty when the key is absent); `who` names
/// the reader in the error for a value that is not one.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::map<std::string, std::string> metadata_strings(safetensors_file const& file,
                                                                                      std::string const& key,
                                                                                      std::string_view who);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::map<std::string, std::string> metadata_strings(safetensors_file const& file,
                                                                                      std::string const& key,
                                                                                      std::string_view who) {
  auto const found = file.metadata().find(key);
  if (found == file.metadata().end()) return {};
  auto const damaged = [&](std::string const& why) {
    fail("shardwise::", who, ": \"", file.path(), "\": its metadata \"", key, "\" is not a JSON object of strings (",
         why, "); the file is damaged: write it again (shardwise consolidate)");
  };
  nlohmann::json const value = parse_bounded_json(found->second, 1, [&](std::size_t) { damaged("nested"); }, damaged);
  std::map<std::string, std::string> strings;
  if (!value.is_object()) damaged(std::string("a ") + value.type_name());
  for (auto const& [name, text] : value.items()) {
    if (!text.is_string()) damaged("\"" + name + "\" is a " + text.type_name());
    strings[name] = text.get<std::string>();
  }
  return strings;
}
#endif

}  // namespace detail

/// The problems found in the safetensors file at `path` (empty: none), one sentence each: every tensor that no
/// longer matches the checksum its writer recorded, and every recorded tensor that is gone. A file without
/// recorded checksums has none to check.
[[nodiscard]] inline std::vector<std::string> verify_safetensors_file(std::string const& path) {
  safetensors_file const file(path);
  std::vector<std::string> problems;
  for (auto const& [name, recorded] : detail::metadata_strings(file, checksums_metadata_key, "verify")) {
    if (!file.contains(name)) {
      problems.push_back(detail::concat("\"", path, "\" lacks tensor \"", name, "\", whose checksum it records"));
      continue;
    }
    std::string const now = detail::hex64(checksum64(file.raw(name)));
    if (now != recorded)
      problems.push_back(detail::concat("\"", path, "\": tensor \"", name,
                                        "\" does not match the checksum its writer recorded (", recorded, ", now ", now,
                                        "): the file is damaged"));
  }
  return problems;
}

}  // namespace shardwise
