#pragma once
// Writing safetensors files: tensors added by name (borrowed when already row-major, copied otherwise), a
// string -> string __metadata__, the header written with nlohmann::json and padded to 8 bytes, the data
// ordered by element size then name so every tensor starts aligned to its element. The file is replaced
// atomically (temporary file, fsync, rename).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/checkpoint/atomic_file.hpp"
#include "shardwise/checkpoint/checksum.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/dtype.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/tensor/concept.hpp"
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES  // JSON is parsed only where the entry points are compiled
#include <nlohmann/json.hpp>
#endif

namespace shardwise {

/// Collects tensors, then writes them as one safetensors file.
class safetensors_writer {
 public:
  /// Adds raw little-endian row-major bytes; they are borrowed and must stay alive until write().
  void add(std::string name, dtype type, std::vector<std::uint64_t> shape, std::span<std::byte const> bytes) {
    if (name == "__metadata__")
      detail::fail("shardwise::safetensors_writer: tensor \"", name,
                   "\": the name is reserved for the file's metadata; pass metadata to write() and rename the tensor");
    if (!names_.insert(name).second)
      detail::fail("shardwise::safetensors_writer: tensor \"", name,
                   "\" is added twice; give every tensor of a file its own name");
    std::uint64_t elements = 1;
    bool overflow = false;
    for (std::uint64_t d : shape) overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
    std::uint64_t expected = 0;
    overflow = overflow || __builtin_mul_overflow(elements, dtype_size(type), &expected);
    if (overflow || expected != bytes.size())
      detail::fail("shardwise::safetensors_writer: tensor \"", name, "\": its shape of ", dtype_name(type), " needs ",
                   overflow ? std::string("more than 2^64") : std::to_string(expected), " bytes but ", bytes.size(),
                   " were given; pass the tensor's whole storage");
    entries_.push_back({std::move(name), type, std::move(shape), bytes.size(), {bytes}, {}, {}});
  }

  /// Adds a tensor whose little-endian row-major bytes are the concatenation of `runs` (each borrowed, alive
  /// until write()): rows that lie in several places are written from where they are, without a copy.
  void add(std::string name, dtype type, std::vector<std::uint64_t> shape,
           std::vector<std::span<std::byte const>> runs) {
    std::size_t total = 0;
    for (auto const& r : runs) total += r.size();
    add(std::move(name), type, std::move(shape),
        std::span<std::byte const>(static_cast<std::byte const*>(nullptr), total));  // checks the size
    entries_.back().runs = std::move(runs);
  }

  /// Adds elements of a safetensors type with the given shape (borrowed).
  template <safetensors_element T>
  void add(std::string name, std::vector<std::uint64_t> shape, std::span<T const> data) {
    add(std::move(name), dtype_of<T>, std::move(shape), std::as_bytes(data));
  }

  /// Adds a shardwise tensor (Eigen, xtensor...): borrowed when its storage is row-major, else copied.
  template <class Tensor>
  void add(std::string name, Tensor const& t) {
    static_assert(detail::check_tensor<Tensor>());
    using T = element_t<Tensor>;
    static_assert(safetensors_element<T>,
                  "shardwise::safetensors_writer: the tensor's element type has no safetensors dtype; use double, "
                  "float, float16, bfloat16, int64_t, int32_t, uint8_t or bool");
    extents const size = shape_of(t);
    std::vector<std::uint64_t> shape(size.dims.begin(), size.dims.begin() + static_cast<std::ptrdiff_t>(size.rank));
    T const* data = detail::traits_of<Tensor>::data(t);
    std::span<std::byte const> bytes(reinterpret_cast<std::byte const*>(data), size.elements() * sizeof(T));
    if (detail::traits_of<Tensor>::order == storage_order::row_major || size.rank <= 1) {
      add(std::move(name), dtype_of<T>, std::move(shape), bytes);
      return;
    }
    std::vector<std::byte> rows(bytes.size());  // column-major storage: write it out row-major
    T* out = reinterpret_cast<T*>(rows.data());
    detail::for_each_element_in_order(size, storage_order::col_major,
                                      [&](std::size_t to, std::size_t from) { out[to] = data[from]; });
    add(std::move(name), dtype_of<T>, std::move(shape), std::span<std::byte const>(rows));
    entries_.back().owned = std::move(rows);  // moving keeps the buffer the span points to
  }

  /// Adds a tensor whose bytes are produced only when the file is written: fill(out) writes them (little-endian,
  /// row-major) into `out`. Tensors are then produced and written one at a time, so writing a file needs the
  /// memory of its largest tensor, not of all of them.
  void add_deferred(std::string name, dtype type, std::vector<std::uint64_t> shape,
                    std::function<void(std::span<std::byte>)> fill) {
    std::uint64_t elements = 1;
    bool overflow = false;
    for (std::uint64_t d : shape) overflow = overflow || __builtin_mul_overflow(elements, d, &elements);
    std::uint64_t bytes = 0;
    if (overflow || __builtin_mul_overflow(elements, dtype_size(type), &bytes))
      detail::fail("shardwise::safetensors_writer: tensor \"", name, "\": its shape needs more than 2^64 bytes");
    // A placeholder span of the right size (never read): the header is laid out from it.
    add(std::move(name), type, std::move(shape),
        std::span<std::byte const>(static_cast<std::byte const*>(nullptr), static_cast<std::size_t>(bytes)));
    entries_.back().runs.clear();
    entries_.back().fill = std::move(fill);
  }

  [[nodiscard]] std::size_t size() const { return entries_.size(); }  ///< How many tensors were added.

  /// Writes the file, replacing `path` atomically. With `checksums_key`, each tensor's checksum64 is computed
  /// while its bytes are written and the metadata gets, under that key, a JSON object of tensor name -> 16 hex
  /// digits (the header is written with placeholders of the same length, then completed).
  void write(std::filesystem::path const& path, std::map<std::string, std::string> const& metadata = {},
             std::string const& checksums_key = {}) const;

 private:
  struct entry {
    std::string name;
    dtype type;
    std::vector<std::uint64_t> shape;
    std::size_t size = 0;                          // bytes
    std::vector<std::span<std::byte const>> runs;  // the bytes, in order (borrowed)
    std::vector<std::byte> owned;
    std::function<void(std::span<std::byte>)> fill;  // deferred: produces the bytes at write time
  };
  std::vector<entry> entries_;
  std::set<std::string, std::less<>> names_;
};

#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void safetensors_writer::write(std::filesystem::path const& path,
                                                                 std::map<std::string, std::string> const& metadata,
                                                                 std::string const& checksums_key) const {
  std::vector<entry const*> order;
  order.reserve(entries_.size());
  for (auto const& e : entries_) order.push_back(&e);
  std::sort(order.begin(), order.end(), [](entry const* a, entry const* b) {
    std::size_t const sa = dtype_size(a->type), sb = dtype_size(b->type);
    return sa != sb ? sa > sb : a->name < b->name;
  });
  std::vector<std::uint64_t> sums(order.size(), 0);
  auto const header_text = [&] {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata.empty() || !checksums_key.empty()) {
      nlohmann::json m = nlohmann::json::object();
      for (auto const& [k, v] : metadata) m[k] = v;
      if (!checksums_key.empty()) {
        nlohmann::json c = nlohmann::json::object();
        for (std::size_t i = 0; i < order.size(); ++i) c[order[i]->name] = detail::hex64(sums[i]);
        m[checksums_key] = c.dump();
      }
      header["__metadata__"] = std::move(m);
    }
    std::uint64_t offset = 0;
    for (entry const* e : order) {
      header[e->name] = {
          {"dtype", dtype_name(e->type)}, {"shape", e->shape}, {"data_offsets", {offset, offset + e->size}}};
      offset += e->size;
    }
    std::string text;
    try {
      text = header.dump();
    } catch (nlohmann::json::exception const& e) {
      detail::fail("shardwise::safetensors_writer: \"", path.string(),
                   "\": a tensor name or metadata is not valid UTF-8 (", e.what(),
                   "); name tensors and metadata in UTF-8");
    }
    text.append((8 - text.size() % 8) % 8, ' ');  // the data then starts at a multiple of 8
    return text;
  };
  std::string text = header_text();  // with checksums: placeholders of the final length
  std::uint64_t const length = text.size();
  std::byte length_bytes[8];
  std::memcpy(length_bytes, &length, 8);  // little-endian host (dtype.hpp)
  detail::atomic_file_writer out(path);
  out.write(std::span<std::byte const>(length_bytes, 8));
  out.write(std::as_bytes(std::span(text.data(), text.size())));
  bool const summing = !checksums_key.empty();
  // Written in slices when summing, so that each slice is summed and then copied out while in the cache.
  constexpr std::size_t slice = std::size_t{1} << 20;
  auto const emit = [&](std::span<std::byte const> bytes, detail::checksum_stream& sum) {
    if (!summing) return out.write(bytes);
    for (std::size_t at = 0; at < bytes.size(); at += slice) {
      auto const part = bytes.subspan(at, std::min(slice, bytes.size() - at));
      sum.update(part);
      out.write(part);
    }
  };
  for (std::size_t i = 0; i < order.size(); ++i) {
    entry const* e = order[i];
    detail::checksum_stream sum;
    if (e->fill) {
      std::vector<std::byte> bytes(e->size);
      e->fill(bytes);
      emit(bytes, sum);
    } else {
      for (auto const& run : e->runs) emit(run, sum);
    }
    sums[i] = sum.finish();
  }
  if (summing) {
    std::string const done = header_text();
    if (done.size() != text.size())
      detail::fail("shardwise::safetensors_writer: \"", path.string(),
                   "\": the header changed length when its checksums were filled in; this is a bug in shardwise");
    out.write_at(8, std::as_bytes(std::span(done.data(), done.size())));
  }
  out.commit();
}
#endif

}  // namespace shardwise
