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
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/checkpoint/dtype.hpp"
#include "shardwise/core/error.hpp"

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
[[nodiscard]] inline safetensors_header parse_safetensors_header(std::span<std::byte const> file,
                                                                 std::string_view file_name);

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

/// How a JSON value looks, for messages about what was expected instead.
inline std::string_view json_kind(nlohmann::json const& v) { return v.type_name(); }

}  // namespace detail

/// Parses and checks the header of a safetensors file whose bytes are `file` (the whole file, or at least
/// its first 8 + N bytes when only the header is wanted — then the data checks use the size it has).
/// Throws shardwise::error naming `file_name`, the tensor, and what to do.
inline safetensors_header parse_safetensors_header(std::span<std::byte const> file, std::string_view file_name) {
  using nlohmann::json;
  auto const where = [&](auto const&... parts) {
    detail::fail("shardwise::safetensors: \"", file_name, "\": ", parts...);
  };
  if (file.size() < 8)
    where("the file is ", file.size(),
          " bytes, shorter than the 8-byte header length that starts a safetensors file; no tensor can be read. "
          "The file is truncated or not safetensors: copy or save it again");
  std::uint64_t const header_bytes = detail::read_le64(file.data());
  if (header_bytes > max_safetensors_header_bytes)
    where("the header length is ", header_bytes, " bytes, above the limit of ", max_safetensors_header_bytes,
          "; no tensor can be read. The file is corrupt or not safetensors: save it again");
  if (header_bytes > file.size() - 8)
    where("the header length ", header_bytes, " goes beyond the end of the file (", file.size() - 8,
          " bytes after the length); no tensor can be read. The file is truncated: copy or save it again");

  safetensors_header header;
  header.data_start = 8 + header_bytes;
  header.data_size = file.size() - header.data_start;

  // The header has three levels (file, tensor, shape): deeper values are dropped while parsing, so a hostile
  // header of nested brackets costs neither memory nor stack.
  bool too_deep = false;
  json::parser_callback_t const limit_depth = [&](int depth, json::parse_event_t event, json&) {
    if ((event == json::parse_event_t::object_start || event == json::parse_event_t::array_start) && depth >= 3) {
      too_deep = true;
      return false;
    }
    return true;
  };
  auto const* text = reinterpret_cast<char const*>(file.data() + 8);
  json root;
  try {
    root = json::parse(text, text + header_bytes, limit_depth);
  } catch (json::exception const& e) {
    where("the header is not valid JSON (", e.what(), "); no tensor can be read. The file is corrupt: save it again");
  }
  if (too_deep)
    where(
        "the header nests JSON deeper than a safetensors header does (file, tensor, shape); no tensor can be "
        "read. The file is corrupt: save it again");
  if (!root.is_object())
    where("the header is a JSON ", detail::json_kind(root),
          ", not an object of tensors; no tensor can be read. The file is not safetensors: save it again");

  for (auto const& item : root.items()) {
    std::string const& name = item.key();
    json const& entry = item.value();
    auto const bad = [&](auto const&... parts) { where("tensor \"", name, "\": ", parts...); };
    if (name == "__metadata__") {
      if (!entry.is_object())
        bad("__metadata__ is a JSON ", detail::json_kind(entry),
            ", not an object of strings; write metadata as string -> string");
      for (auto const& [key, value] : entry.items()) {
        if (!value.is_string())
          bad("__metadata__ value of \"", key, "\" is a JSON ", detail::json_kind(value),
              ", not a string; write metadata as string -> string");
        header.metadata.emplace(key, value.get<std::string>());
      }
      continue;
    }
    if (!entry.is_object())
      bad("the entry is a JSON ", detail::json_kind(entry),
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
    if (!dt->is_string()) bad("dtype is a JSON ", detail::json_kind(*dt), ", not a string such as \"F32\"");
    auto const type = parse_dtype(dt->get_ref<std::string const&>());
    if (!type)
      bad("dtype \"", dt->get_ref<std::string const&>(),
          "\" is not one shardwise reads (F64, F32, F16, BF16, I64, I32, U8, BOOL); convert the tensor to one of "
          "them before loading, e.g. with safetensors and torch in Python");
    if (!sh->is_array()) bad("shape is a JSON ", detail::json_kind(*sh), ", not an array of sizes");
    tensor_info info;
    info.name = name;
    info.type = *type;
    info.shape.reserve(sh->size());  // bounded by the header's size, already in memory
    std::uint64_t elements = 1;
    bool overflow = false;
    for (auto const& d : *sh) {
      if (!d.is_number_unsigned())
        bad("shape holds ", d.dump(), ", not a size (an integer >= 0); the file is corrupt: save it again");
      std::uint64_t const size = d.get<std::uint64_t>();
      info.shape.push_back(size);
      overflow = overflow || __builtin_mul_overflow(elements, size, &elements);
    }
    if (!off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() || !(*off)[1].is_number_unsigned())
      bad("data_offsets is ", off->dump(), ", not [begin, end] with integers >= 0; the file is corrupt: save it again");
    info.begin = (*off)[0].get<std::uint64_t>();
    info.end = (*off)[1].get<std::uint64_t>();
    if (info.end < info.begin)
      bad("data_offsets [", info.begin, ", ", info.end, "] end before they begin; the file is corrupt: save it again");
    if (info.end > header.data_size)
      bad("data_offsets [", info.begin, ", ", info.end, "] go beyond the ", header.data_size,
          " data bytes of the file; the file is truncated or corrupt: copy or save it again");
    std::uint64_t expected = 0;
    bool const huge = overflow || __builtin_mul_overflow(elements, dtype_size(*type), &expected);
    if (huge || expected != info.bytes())
      bad("shape ", sh->dump(), " of ", dtype_name(*type), " needs ",
          huge ? std::string("more than 2^64") : std::to_string(expected), " bytes, but data_offsets [", info.begin,
          ", ", info.end, "] hold ", info.bytes(), "; the file is corrupt: save it again");
    header.tensors.push_back(std::move(info));
  }

  // Every data byte belongs to exactly one tensor: no overlap (two tensors sharing bytes), no hole.
  std::sort(header.tensors.begin(), header.tensors.end(), [](tensor_info const& a, tensor_info const& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  std::uint64_t covered = 0;
  tensor_info const* previous = nullptr;
  for (tensor_info const& t : header.tensors) {
    if (t.begin < covered)
      where("tensor \"", t.name, "\": data_offsets [", t.begin, ", ", t.end, "] overlap those of tensor \"",
            previous->name, "\" [", previous->begin, ", ", previous->end, "]; the file is corrupt: save it again");
    if (t.begin > covered)
      where("tensor \"", t.name, "\": data_offsets [", t.begin, ", ", t.end, "] leave bytes ", covered, "..", t.begin,
            " of the data to no tensor; the file is corrupt or not safetensors: save it again");
    covered = t.end;
    if (t.end > t.begin) previous = &t;
  }
  if (covered != header.data_size)
    where(header.tensors.empty() ? std::string("the file has no tensor")
                                 : "tensor \"" + header.tensors.back().name + "\"",
          ": the data ends at byte ", covered, " but the file has ", header.data_size,
          " data bytes; the file has bytes no tensor uses and was not written whole: save it again");
  for (std::size_t i = 0; i < header.tensors.size(); ++i) header.index_.emplace(header.tensors[i].name, i);
  return header;
}

}  // namespace shardwise
