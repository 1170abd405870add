#pragma once
// The safetensors header: 8 bytes of little-endian length N, then N bytes of JSON
//   {"__metadata__": {"k": "v"}, "name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [begin, end]}, ...}
// then the data, every byte of it belonging to exactly one tensor. The JSON is parsed with nlohmann::json and
// everything in it is checked before it is used: no size read from the file is trusted for an allocation or
// an access until it has been compared with the file's real size.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/dtype.hpp"
#include "shardwise/core/error.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES  // JSON is parsed only where the entry points are compiled
#include <nlohmann/json.hpp>

#include "shardwise/core/bounded_json.hpp"
#endif

namespace shardwise {

/// The largest header shardwise parses, as Hugging Face's safetensors does (100 MB).
inline constexpr std::uint64_t max_safetensors_header_bytes = 100'000'000;

/// One tensor of a safetensors file, as its header describes it (already checked against the file).
struct tensor_info {
  std::string name;                  ///< The tensor's name.
  dtype type = dtype::F32;           ///< Its element type.
  std::vector<std::uint64_t> shape;  ///< Its shape.
  std::uint64_t begin = 0;           ///< Byte offset of its first byte in the data section.
  std::uint64_t end = 0;             ///< Byte offset one past its last byte in the data section.

  /// The number of elements (the product of the shape).
  [[nodiscard]] std::uint64_t elements() const {
    std::uint64_t n = 1;
    for (std::uint64_t d : shape) n *= d;  // cannot overflow: checked against the byte count when parsed
    return n;
  }
  [[nodiscard]] std::uint64_t bytes() const { return end - begin; }  ///< The size of its data.
};

struct safetensors_header;
[[nodiscard]] SHARDWISE_DETAIL_CHECKPOINT_ENTRY safetensors_header
parse_safetensors_header(std::span<std::byte const> file, std::string_view file_name);

/// A parsed and checked header.
struct safetensors_header {
  std::vector<tensor_info> tensors;                          ///< The tensors, in the order of their data.
  std::map<std::string, std::string, std::less<>> metadata;  ///< The header's "__metadata__".
  std::uint64_t data_start = 0;                              ///< Where the data section starts: 8 + header length.
  std::uint64_t data_size = 0;                               ///< The data section's size (the rest of the file).

  /// The tensor called `name`, or null.
  [[nodiscard]] tensor_info const* find(std::string_view name) const {
    auto const it = index_.find(name);
    return it == index_.end() ? nullptr : &tensors[it->second];
  }

 private:
  std::map<std::string, std::size_t, std::less<>> index_;
  friend safetensors_header parse_safetensors_header(std::span<std::byte const>, std::string_view);
};

namespace detail {

inline std::uint64_t read_le64(std::byte const* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);  // little-endian host (checked in dtype.hpp)
  return v;
}

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
/// How a JSON value looks, for messages about what was expected instead.
inline std::string_view json_kind(nlohmann::json const& v) { return v.type_name(); }
#endif

}  // namespace detail

namespace detail {

/// Raises shardwise::error about one safetensors file: "shardwise::safetensors: "<file>": " and the parts;
/// with a tensor named, "tensor "<name>": " after the file.
struct header_error {
  std::string_view file;
  std::string const* tensor = nullptr;  ///< The tensor the error is about, if any.

  template <class... Parts>
  [[noreturn]] void operator()(Parts const&... parts) const {
    if (!tensor) fail("shardwise::safetensors: \"", file, "\": ", parts...);
    fail("shardwise::safetensors: \"", file, "\": tensor \"", *tensor, "\": ", parts...);
  }
};

/// The header's length N from the file's first 8 bytes, checked against the limit and the file's size.
inline std::uint64_t safetensors_header_length(std::span<std::byte const> file, header_error const& where) {
  if (file.size() < 8)
    where("the file is ", file.size(),
          " bytes, shorter than the 8-byte header length that starts a safetensors file; no tensor can be read. "
          "The file is truncated or not safetensors: copy or save it again");
  std::uint64_t const header_bytes = read_le64(file.data());
  if (header_bytes > max_safetensors_header_bytes)
    where("the header length is ", header_bytes, " bytes, above the limit of ", max_safetensors_header_bytes,
          "; no tensor can be read. The file is corrupt or not safetensors: save it again");
  if (header_bytes > file.size() - 8)
    where("the header length ", header_bytes, " goes beyond the end of the file (", file.size() - 8,
          " bytes after the length); no tensor can be read. The file is truncated: copy or save it again");
  return header_bytes;
}

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
/// The header's JSON object. The header has three levels (file, tensor, shape): deeper text is refused before it
/// is parsed, so a hostile header of nested brackets costs neither memory nor stack, and the parse is linear.
inline nlohmann::json parse_header_json(char const* text, std::uint64_t bytes, header_error const& where) {
  nlohmann::json const root = parse_bounded_json(
      std::string_view(text, static_cast<std::size_t>(bytes)), 3,
      [&](std::size_t) {
        where(
            "the header nests JSON deeper than a safetensors header does (file, tensor, shape); no tensor can be "
            "read. The file is corrupt: save it again");
      },
      [&](std::string const& reason) {
        where("the header is not valid JSON (", reason, "); no tensor can be read. The file is corrupt: save it again");
      });
  if (!root.is_object())
    where("the header is a JSON ", json_kind(root),
          ", not an object of tensors; no tensor can be read. The file is not safetensors: save it again");
  return root;
}

/// The "__metadata__" entry: strings to strings.
inline void read_header_metadata(nlohmann::json const& entry, std::map<std::string, std::string, std::less<>>& into,
                                 header_error const& bad) {
  if (!entry.is_object())
    bad("__metadata__ is a JSON ", json_kind(entry), ", not an object of strings; write metadata as string -> string");
  for (auto const& [key, value] : entry.items()) {
    if (!value.is_string())
      bad("__metadata__ value of \"", key, "\" is a JSON ", json_kind(value),
          ", not a string; write metadata as string -> string");
    into.emplace(key, value.get<std::string>());
  }
}

/// The entry's dtype, one shardwise reads.
inline dtype entry_dtype(nlohmann::json const& dt, header_error const& bad) {
  if (!dt.is_string()) bad("dtype is a JSON ", json_kind(dt), ", not a string such as \"F32\"");
  auto const type = parse_dtype(dt.get_ref<std::string const&>());
  if (!type)
    bad("dtype \"", dt.get_ref<std::string const&>(),
        "\" is not one shardwise reads (F64, F32, F16, BF16, I64, I32, U8, BOOL); convert the tensor to one of "
        "them before loading, e.g. with safetensors and torch in Python");
  return *type;
}

/// The entry's shape into info.shape; its element count, or no count when it overflows 64 bits.
inline std::optional<std::uint64_t> entry_shape(nlohmann::json const& sh, tensor_info& info, header_error const& bad) {
  if (!sh.is_array()) bad("shape is a JSON ", json_kind(sh), ", not an array of sizes");
  info.shape.reserve(sh.size());  // bounded by the header's size, already in memory
  std::uint64_t elements = 1;
  bool overflow = false;
  for (auto const& d : sh) {
    if (!d.is_number_unsigned())
      bad("shape holds ", d.dump(), ", not a size (an integer >= 0); the file is corrupt: save it again");
    std::uint64_t const size = d.get<std::uint64_t>();
    info.shape.push_back(size);
    overflow = overflow || __builtin_mul_overflow(elements, size, &elements);
  }
  if (overflow) return std::nullopt;
  return elements;
}

/// One tensor's entry, checked: its dtype, shape and data_offsets, which must lie in the data section and hold
/// exactly the shape's bytes.
inline tensor_info read_tensor_entry(std::string const& name, nlohmann::json const& entry, std::uint64_t data_size,
                                     header_error const& bad) {
  if (!entry.is_object())
    bad("the entry is a JSON ", json_kind(entry),
        ", not an object with dtype, shape and data_offsets; the file is corrupt: save it again");
  auto const dt = entry.find("dtype");
  auto const sh = entry.find("shape");
  auto const off = entry.find("data_offsets");
  if (dt == entry.end() || sh == entry.end() || off == entry.end())
    bad("the entry lacks ",
        dt == entry.end()   ? "dtype"
        : sh == entry.end() ? "shape"
                            : "data_offsets",
        "; the file is corrupt: save it again");
  tensor_info info;
  info.name = name;
  info.type = entry_dtype(*dt, bad);
  auto const elements = entry_shape(*sh, info, bad);
  if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
    bad("data_offsets is ", off->dump(), ", not [begin, end] with integers >= 0; the file is corrupt: save it again");
  info.begin = (*off)[0].get<std::uint64_t>();
  info.end = (*off)[1].get<std::uint64_t>();
  if (info.end < info.begin)
    bad("data_offsets [", info.begin, ", ", info.end, "] end before they begin; the file is corrupt: save it again");
  if (info.end > data_size)
    bad("data_offsets [", info.begin, ", ", info.end, "] go beyond the ", data_size,
        " data bytes of the file; the file is truncated or corrupt: copy or save it again");
  std::uint64_t expected = 0;
  bool const huge = !elements || __builtin_mul_overflow(*elements, dtype_size(info.type), &expected);
  if (huge || expected != info.bytes())
    bad("shape ", sh->dump(), " of ", dtype_name(info.type), " needs ",
        huge ? std::string("more than 2^64") : std::to_string(expected), " bytes, but data_offsets [", info.begin, ", ",
        info.end, "] hold ", info.bytes(), "; the file is corrupt: save it again");
  return info;
}

/// Every data byte belongs to exactly one tensor: no overlap (two tensors sharing bytes), no hole. Sorts the
/// tensors into the order of their data.
inline void check_data_covered(std::vector<tensor_info>& tensors, std::uint64_t data_size, header_error const& where) {
  std::sort(tensors.begin(), tensors.end(), [](tensor_info const& a, tensor_info const& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  tensor_info const* previous = nullptr;
  for (tensor_info const& t : tensors) {
    if (t.begin < covered)
      where("tensor \"", t.name, "\": data_offsets [", t.begin, ", ", t.end, "] overlap those of tensor \"",
            previous->name, "\" [", previous->begin, ", ", previous->end, "]; the file is corrupt: save it again");
    if (t.begin > covered)
      where("tensor \"", t.name, "\": data_offsets [", t.begin, ", ", t.end, "] leave bytes ", covered, "..", t.begin,
            " of the data to no tensor; the file is corrupt or not safetensors: save it again");
    covered = t.end;
    if (t.end > t.begin) previous = &t;
  }
  if (covered != data_size)
    where(tensors.empty() ? std::string("the file has no tensor") : "tensor \"" + tensors.back().name + "\"",
          ": the data ends at byte ", covered, " but the file has ", data_size,
          " data bytes; the file has bytes no tensor uses and was not written whole: save it again");
}
#endif

}  // namespace detail

/// Parses and checks the header of a safetensors file whose bytes are `file` (the whole file, or at least
/// its first 8 + N bytes when only the header is wanted — then the data checks use the size it has).
/// Throws shardwise::error naming `file_name`, the tensor, and what to do.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY safetensors_header parse_safetensors_header(std::span<std::byte const> file,
                                                                              std::string_view file_name);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY safetensors_header parse_safetensors_header(std::span<std::byte const> file,
                                                                              std::string_view file_name) {
  detail::header_error const where{file_name};
  std::uint64_t const header_bytes = detail::safetensors_header_length(file, where);
  safetensors_header header;
  header.data_start = 8 + header_bytes;
  header.data_size = file.size() - header.data_start;
  auto const root = detail::parse_header_json(reinterpret_cast<char const*>(file.data() + 8), header_bytes, where);
  for (auto const& item : root.items()) {
    detail::header_error const bad{file_name, &item.key()};
    if (item.key() == "__metadata__")
      detail::read_header_metadata(item.value(), header.metadata, bad);
    else
      header.tensors.push_back(detail::read_tensor_entry(item.key(), item.value(), header.data_size, bad));
  }
  detail::check_data_covered(header.tensors, header.data_size, where);
  for (std::size_t i = 0; i < header.tensors.size(); ++i) header.index_.emplace(header.tensors[i].name, i);
  return header;
}
#endif

}  // namespace shardwise
