#pragma once
// The index of a sharded checkpoint, dir/shardwise_checkpoint.json: every tensor with its global (unpadded)
// shape, dtype and placement on the tp axis, and the pieces that hold it — a file under
// tensor_parallel_shards/tp_rank_XX_pp_rank_XX/ and the box of the global tensor it stores — plus the mesh
// sizes, the step and the user's metadata. Written and read with nlohmann::json; everything read is checked,
// including that the pieces of every tensor cover it exactly once.
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <limits>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/checksum.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/dtype.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/core/read_file.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES  // JSON is parsed only where the entry points are compiled
#include <nlohmann/json.hpp>

#include "shardwise/core/bounded_json.hpp"
#endif

namespace shardwise {

/// The index's file name in the checkpoint folder.
inline constexpr std::string_view checkpoint_index_name = "shardwise_checkpoint.json";
/// The index's "format" value.
inline constexpr std::string_view checkpoint_format = "shardwise.sharded_checkpoint";

/// The start of the names under which a sharded checkpoint holds optimizer state beside the parameters
/// ("optimizer.layers.0.attention.wq.weight.exp_avg"): loads of the model alone and consolidate pass over them.
inline constexpr std::string_view optimizer_state_prefix = "optimizer.";

/// One file's part of a tensor: the box [offset, offset + shape) of the global tensor.
struct checkpoint_piece {
  std::string file;  ///< The safetensors file, relative to the checkpoint folder.
  /// The box's start and size in the global tensor, one number a dimension.
  /// @{
  std::vector<std::uint64_t> offset, shape;
  /// @}
  /// The tensor's name in the file when it differs (a consolidated file); not saved.
  std::string name_in_file = {};
  /// Whether the file stores the tensor transposed (GPT-2's Conv1D keeps [in, out]); not saved.
  bool transposed = false;
  /// Where the box starts in the file's tensor when that tensor is bigger (q of a fused q|k|v), counted after
  /// transposing it (in the model's orientation). Empty: at the origin. Not saved.
  std::vector<std::uint64_t> offset_in_file = {};
  /// The index along the file tensor's first dimension when that tensor stacks the model's (an expert of
  /// transformers' fused experts), its remaining dimensions being the model tensor's; -1: not stacked. Not saved.
  std::int64_t stacked_index = -1;
  /// The checksum64 of the piece's bytes in the file, 16 hex digits (empty: not recorded).
  std::string checksum = {};
};

/// One tensor of a sharded checkpoint and the pieces that hold it.
struct checkpoint_tensor {
  std::string name;         ///< The tensor's name in the model ("layers.0.attention.wq.weight").
  dtype type = dtype::F32;  ///< Its element type in the files.
  /// The global shape, without vocabulary padding or repeated key-value heads.
  std::vector<std::uint64_t> shape;
  /// The placement on the tp axis: "Shard(dim=0)", "Shard(dim=1)" or "Replicate()".
  std::string placement;
  std::vector<checkpoint_piece> pieces;  ///< The pieces, which together cover the tensor exactly once.
};

/// The contents of a checkpoint's index file.
struct checkpoint_index {
  std::int64_t step = 0;  ///< The training step it was saved at.
  /// The mesh the checkpoint was saved from: its tp and pp sizes.
  /// @{
  int tp = 1, pp = 1;
  /// @}
  /// FSDP's data-parallel size when each dp rank saved its own shards (rank folders end in "_dp_rank_XX"), else 1.
  int dp = 1;
  std::map<std::string, std::string> metadata;  ///< The user's metadata.
  /// The model's configuration (its shardwise_config()), compared with the loading model's.
  std::map<std::string, std::string> config;
  std::vector<checkpoint_tensor> tensors;  ///< The tensors, in the model's order.
  /// The number naming this save, also written into every rank file, so that a loader can tell a whole save
  /// from files of two saves (a reader racing a saver); 0 in checkpoints written before it existed.
  std::uint64_t generation = 0;

  /// The tensor called `name`, or null.
  [[nodiscard]] checkpoint_tensor const* find(std::string_view name) const {
    for (auto const& t : tensors)
      if (t.name == name) return &t;
    return nullptr;
  }
  /// The tensor called `name`, or null.
  [[nodiscard]] checkpoint_tensor* find(std::string_view name) {
    return const_cast<checkpoint_tensor*>(std::as_const(*this).find(name));
  }
};

/// "tensor_parallel_shards/tp_rank_03_pp_rank_00" (optimum-neuron's layout).
[[nodiscard]] inline std::string rank_folder(int tp_rank, int pp_rank) {
  char name[96];
  std::snprintf(name, sizeof name, "tensor_parallel_shards/tp_rank_%02d_pp_rank_%02d", tp_rank, pp_rank);
  return name;
}

/// "tensor_parallel_shards/tp_rank_03_pp_rank_00_dp_rank_01": a rank's folder in an FSDP checkpoint, or in one of
/// experts placed over the dp ranks.
[[nodiscard]] inline std::string rank_folder(int tp_rank, int pp_rank, int dp_rank) {
  char suffix[32];
  std::snprintf(suffix, sizeof suffix, "_dp_rank_%02d", dp_rank);
  return rank_folder(tp_rank, pp_rank) + suffix;
}

namespace detail {

inline std::uint64_t volume(std::vector<std::uint64_t> const& shape) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;  // the index's shapes were checked by checked_volume when it was read
  return n;
}

/// The product of a shape from a file, or fails naming `what` when it exceeds 2^64.
inline std::uint64_t checked_volume(std::vector<std::uint64_t> const& shape, std::string_view where,
                                    std::string const& name, std::string_view what) {
  std::uint64_t n = 1;
  for (auto d : shape)
    if (__builtin_mul_overflow(n, d, &n))
      fail("shardwise::checkpoint: \"", where, "\": tensor \"", name, "\": ", what,
           " holds more than 2^64 elements; the checkpoint is corrupt: save it again");
  return n;
}

/// Throws unless the pieces lie inside the tensor and cover it exactly once (no gap, no overlap).
inline void check_coverage(checkpoint_tensor const& t, std::string_view where) {
  (void)checked_volume(t.shape, where, t.name, "its shape");
  std::uint64_t covered = 0;
  for (std::size_t i = 0; i < t.pieces.size(); ++i) {
    auto const& p = t.pieces[i];
    if (p.offset.size() != t.shape.size() || p.shape.size() != t.shape.size())
      fail("shardwise::checkpoint: \"", where, "\": tensor \"", t.name, "\": the piece in \"", p.file,
           "\" has a box of another rank than the tensor's shape; the checkpoint is corrupt: save it again");
    for (std::size_t d = 0; d < t.shape.size(); ++d)
      if (p.offset[d] > t.shape[d] || p.shape[d] > t.shape[d] - p.offset[d])
        fail("shardwise::checkpoint: \"", where, "\": tensor \"", t.name, "\": the piece in \"", p.file,
             "\" reaches beyond the tensor in dimension ", d, "; the checkpoint is corrupt: save it again");
    for (std::size_t j = 0; j < i; ++j) {
      auto const& q = t.pieces[j];
      bool disjoint = false;
      for (std::size_t d = 0; d < t.shape.size(); ++d)
        disjoint = disjoint || p.offset[d] + p.shape[d] <= q.offset[d] || q.offset[d] + q.shape[d] <= p.offset[d];
      if (!disjoint && volume(p.shape) && volume(q.shape))
        fail("shardwise::checkpoint: \"", where, "\": tensor \"", t.name, "\": the pieces in \"", q.file, "\" and \"",
             p.file, "\" overlap; each element must be saved once: save the checkpoint again");
    }
    covered += volume(p.shape);
  }
  if (covered != volume(t.shape))
    fail("shardwise::checkpoint: \"", where, "\": tensor \"", t.name, "\": its pieces hold ", covered, " of its ",
         volume(t.shape), " elements; a rank's shard is missing: save the checkpoint again");
}

/// The largest tp, pp or dp size an index may name: beyond any cluster, small enough for every product of them.
inline constexpr std::int64_t max_index_mesh_size = 1 << 20;

template <class... Parts>
[[noreturn]] void fail_index(std::string const& file, Parts const&... parts) {
  fail("shardwise::load_sharded: \"", file, "\" ", parts...,
       "; the checkpoint is corrupt or of another version: save it again");
}

/// The tp and pp ranks of the folder "tensor_parallel_shards/tp_rank_XX_pp_rank_YY/" a piece's file is in (by
/// from_chars: sscanf's %d on a number past int is undefined behaviour, and these names come from a file).
inline std::optional<std::pair<int, int>> piece_ranks(std::string const& file) {
  auto const read = [&](std::size_t& at, std::string_view prefix, int& value) {
    if (file.compare(at, prefix.size(), prefix) != 0) return false;
    char const* const begin = file.data() + at + prefix.size();
    auto const [end, error] = std::from_chars(begin, file.data() + file.size(), value);
    at = static_cast<std::size_t>(end - file.data());
    return error == std::errc{} && end != begin;
  };
  std::size_t at = file.find("tp_rank_");
  int tp = -1, pp = -1;
  if (at == std::string::npos || !read(at, "tp_rank_", tp) || !read(at, "_pp_rank_", pp)) return std::nullopt;
  return std::pair{tp, pp};
}

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
/// An integer field of an index, checked before it is converted: JSON may hold 2.2e23, 1.5 or -1 where a count
/// belongs, and converting those is undefined behaviour, not an error. `bad` raises, naming `what`.
template <class Int, class Bad>
Int index_integer(nlohmann::json const& value, char const* what, Bad const& bad) {
  constexpr bool is_signed = std::is_signed_v<Int>;
  bool const integral = is_signed ? value.is_number_integer() : value.is_number_unsigned();
  if (!integral || (is_signed && value.is_number_unsigned() &&
                    value.get<std::uint64_t>() > static_cast<std::uint64_t>(std::numeric_limits<Int>::max())))
    bad("has ", what, " ", value.dump(), ", which is not ", is_signed ? "a 64-bit integer" : "an integer >= 0");
  return value.get<Int>();
}

/// A list of sizes (a shape, an offset), each checked as index_integer checks one.
template <class Bad>
std::vector<std::uint64_t> index_sizes(nlohmann::json const& value, char const* what, Bad const& bad) {
  if (!value.is_array()) bad("has ", what, " ", value.dump(), ", which is not a list of sizes");
  std::vector<std::uint64_t> sizes;
  sizes.reserve(value.size());  // bounded by the index's text, already in memory
  for (auto const& size : value) sizes.push_back(index_integer<std::uint64_t>(size, what, bad));
  return sizes;
}
#endif

inline std::string shape_text(std::vector<std::uint64_t> const& shape) {
  std::ostringstream out;
  out << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) out << (i ? ", " : "") << shape[i];
  return out.str() + ']';
}

}  // namespace detail

/// The index as the text of its JSON file.
[[nodiscard]] SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string to_json(checkpoint_index const& index);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
[[nodiscard]] SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string to_json(checkpoint_index const& index) {
  nlohmann::json tensors = nlohmann::json::array();
  for (auto const& t : index.tensors) {
    nlohmann::json pieces = nlohmann::json::array();
    for (auto const& p : t.pieces) {
      nlohmann::json piece = {{"file", p.file}, {"offset", p.offset}, {"shape", p.shape}};
      if (!p.checksum.empty()) piece["checksum"] = p.checksum;
      pieces.push_back(std::move(piece));
    }
    tensors.push_back({{"name", t.name},
                       {"shape", t.shape},
                       {"dtype", dtype_name(t.type)},
                       {"placement", {{"tp", t.placement}}},
                       {"pieces", std::move(pieces)}});
  }
  nlohmann::json root = {{"format", checkpoint_format}, {"version", 1},
                         {"step", index.step},          {"mesh", {{"tp", index.tp}, {"pp", index.pp}}},
                         {"metadata", index.metadata},  {"tensors", std::move(tensors)}};
  if (index.dp > 1) root["mesh"]["dp"] = index.dp;
  if (index.generation != 0) root["generation"] = detail::hex64(index.generation);
  if (!index.config.empty()) root["config"] = index.config;
  return root.dump(1) + "\n";
}
#endif

/// Checks and reads the text of a checkpoint's index; `file` names it in errors.
[[nodiscard]] SHARDWISE_DETAIL_CHECKPOINT_ENTRY checkpoint_index checkpoint_index_from_json(std::string_view text,
                                                                                            std::string const& file);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
[[nodiscard]] SHARDWISE_DETAIL_CHECKPOINT_ENTRY checkpoint_index checkpoint_index_from_json(std::string_view text,
                                                                                            std::string const& file) {
  using nlohmann::json;
  auto const bad = [&](auto const&... parts) { detail::fail_index(file, parts...); };
  json const root = detail::parse_bounded_json(
      text, detail::max_json_depth,
      [&](std::size_t depth) { bad("nests JSON ", depth, " deep, deeper than an index does"); },
      [&](std::string const& reason) { bad("is not valid JSON (", reason, ")"); });
  checkpoint_index index;
  try {
    if (!root.is_object() || root.value("format", "") != checkpoint_format)
      bad("is not a shardwise checkpoint index (no \"format\": \"", checkpoint_format, "\")");
    if (root.at("version") != 1) bad("has version ", root.at("version").dump(), "; this shardwise reads 1");
    index.step = detail::index_integer<std::int64_t>(root.at("step"), "step", bad);
    auto const mesh_size = [&](char const* axis, std::int64_t fallback) {
      json const& mesh = root.at("mesh");
      std::int64_t const size =
          mesh.contains(axis) ? detail::index_integer<std::int64_t>(mesh.at(axis), "a mesh size", bad) : fallback;
      if (size < 1 || size > detail::max_index_mesh_size)
        bad("has a mesh whose ", axis, " size is ", mesh.at(axis).dump(), ", outside 1..", detail::max_index_mesh_size);
      return static_cast<int>(size);
    };
    index.tp = mesh_size("tp", 0), index.pp = mesh_size("pp", 0), index.dp = mesh_size("dp", 1);
    index.metadata = root.at("metadata").get<std::map<std::string, std::string>>();
    if (root.contains("config")) index.config = root.at("config").get<std::map<std::string, std::string>>();
    if (root.contains("generation")) {
      std::string const g = root.at("generation").get<std::string>();
      if (g.size() != 16 || g.find_first_not_of("0123456789abcdef") != std::string::npos)
        bad("has generation \"", g, "\", which is not 16 hex digits");
      index.generation = std::stoull(g, nullptr, 16);
    }
    std::set<std::string, std::less<>> names;  // a search of the list per tensor would be quadratic
    for (auto const& t : root.at("tensors")) {
      checkpoint_tensor tensor;
      tensor.name = t.at("name").get<std::string>();
      auto const type = parse_dtype(t.at("dtype").get<std::string>());
      if (!type)
        bad("tensor \"", tensor.name, "\" has dtype ", t.at("dtype").dump(), ", which shardwise does not read");
      tensor.type = *type;
      tensor.shape = detail::index_sizes(t.at("shape"), "a tensor's shape", bad);
      tensor.placement = t.at("placement").at("tp").get<std::string>();
      for (auto const& p : t.at("pieces")) {
        tensor.pieces.push_back({p.at("file").get<std::string>(), detail::index_sizes(p.at("offset"), "an offset", bad),
                                 detail::index_sizes(p.at("shape"), "a piece's shape", bad)});
        tensor.pieces.back().checksum = p.value("checksum", "");
      }
      for (auto const& p : tensor.pieces)
        if (p.file.find("..") != std::string::npos || (!p.file.empty() && p.file.front() == '/'))
          bad("tensor \"", tensor.name, "\" names the file \"", p.file, "\" outside the checkpoint folder");
      for (auto const& p : tensor.pieces)
        if (auto const r = detail::piece_ranks(p.file); r && (r->first >= index.tp || r->second >= index.pp))
          bad("tensor \"", tensor.name, "\" has a piece in \"", p.file, "\", of tp rank ", r->first, " and pp rank ",
              r->second, ", outside the index's mesh of tp ", index.tp, " x pp ", index.pp,
              ": the mesh and the pieces disagree");
      if (!names.insert(tensor.name).second) bad("lists tensor \"", tensor.name, "\" twice");
      detail::check_coverage(tensor, file);
      index.tensors.push_back(std::move(tensor));
    }
  } catch (json::exception const& e) {
    bad("lacks a field or has one of the wrong type (", e.what(), ")");
  }
  return index;
}
#endif

/// Reads and checks dir/shardwise_checkpoint.json.
[[nodiscard]] SHARDWISE_DETAIL_CHECKPOINT_ENTRY checkpoint_index
read_checkpoint_index(std::filesystem::path const& dir);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
[[nodiscard]] SHARDWISE_DETAIL_CHECKPOINT_ENTRY checkpoint_index
read_checkpoint_index(std::filesystem::path const& dir) {
  std::string const file = (dir / checkpoint_index_name).string();
  std::string const fix =
      detail::concat("give the folder save_sharded wrote (\"", dir.string(),
                     "\" is not a complete shardwise checkpoint without a readable ", checkpoint_index_name, ")");
  return checkpoint_index_from_json(detail::read_regular_file(file, "shardwise::load_sharded", fix), file);
}
#endif

}  // namespace shardwise
