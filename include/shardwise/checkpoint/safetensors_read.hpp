#pragma once
// Reading safetensors files through a read-only memory map: whole tensors, a box of index ranges (a slice of
// rows, a block of columns...) copied without touching the rest of the file, into plain buffers or into any
// shardwise tensor (Eigen, xtensor). Floating-point data converts between F64, F32, F16 and BF16 on the way;
// integers and bools are read as their own type.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "shardwise/checkpoint/dtype.hpp"
#include "shardwise/checkpoint/mapped_file.hpp"
#include "shardwise/checkpoint/safetensors_header.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/concept.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise {

namespace detail {

/// Whether elements stored as `from` can be read as T.
template <class T>
constexpr bool can_read_as(dtype from) {
  if (from == dtype_of<T>) return true;
  return (std::is_same_v<T, float> || std::is_same_v<T, double>) && is_floating(from);
}

/// Decodes n elements of dtype `from` at src (any alignment) into dst. can_read_as<T>(from) holds.
template <class T>
void decode_elements(std::byte const* src, dtype from, T* dst, std::size_t n) {
  if constexpr (std::is_same_v<T, bool>) {
    for (std::size_t i = 0; i < n; ++i) dst[i] = src[i] != std::byte{0};  // any non-zero byte is true
  } else if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
    auto const each = [&](auto stored_type, auto to_value) {
      using S = decltype(stored_type);
      for (std::size_t i = 0; i < n; ++i) {
        S s;
        std::memcpy(&s, src + i * sizeof(S), sizeof(S));
        dst[i] = static_cast<T>(to_value(s));
      }
    };
    if (from == dtype_of<T>) {
      if (n) std::memcpy(dst, src, n * sizeof(T));
    } else if (from == dtype::F64) {
      each(double{}, [](double v) { return v; });
    } else if (from == dtype::F32) {
      each(float{}, [](float v) { return v; });
    } else if (from == dtype::F16) {
      each(float16{}, [](float16 v) { return to_float(v); });
    } else {
      each(bfloat16{}, [](bfloat16 v) { return to_float(v); });
    }
  } else {
    if (n) std::memcpy(dst, src, n * sizeof(T));
  }
}

/// Visits every element of a tensor of shape `size` in row-major order, calling fn(row_major_index, index) with
/// the element's index in storage order `order`.
template <class Fn>
void for_each_element_in_order(extents const& size, storage_order order, Fn&& fn) {
  std::size_t const rank = size.rank;
  std::size_t const n = size.elements();
  if (n == 0) return;
  std::size_t stride[max_rank];  // strides of the destination in the destination's order
  std::size_t s = 1;
  for (std::size_t k = 0; k < rank; ++k) {
    std::size_t const d = order == storage_order::col_major ? k : rank - 1 - k;
    stride[d] = s;
    s *= size[d];
  }
  std::size_t index[max_rank] = {};
  for (std::size_t linear = 0; linear < n; ++linear) {
    std::size_t target = 0;
    for (std::size_t d = 0; d < rank; ++d) target += index[d] * stride[d];
    fn(linear, target);
    for (std::size_t d = rank; d-- > 0;) {
      if (++index[d] < size[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace detail

/// An open safetensors file: the header checked, the data mapped and read on demand.
class safetensors_file {
 public:
  /// Opens, maps and checks `path`; throws shardwise::error naming the file and tensor on bad input.
  explicit safetensors_file(std::string path) : file_(std::move(path)) {
    header_ = parse_safetensors_header(file_.bytes(), file_.path());
  }

  [[nodiscard]] std::string const& path() const { return file_.path(); }  ///< The path it was opened with.
  /// Every tensor, in the order of their data.
  [[nodiscard]] std::vector<tensor_info> const& tensors() const { return header_.tensors; }
  [[nodiscard]] auto const& metadata() const { return header_.metadata; }  ///< The header's "__metadata__".
  /// Whether the file has a tensor called `name`.
  [[nodiscard]] bool contains(std::string_view name) const { return header_.find(name) != nullptr; }

  /// The tensor called `name`; throws, listing a few names the file has, when it has none of that name.
  [[nodiscard]] tensor_info const& info(std::string_view name) const {
    if (auto const* t = header_.find(name)) return *t;
    std::string some;
    std::size_t shown = 0;
    for (auto const& t : header_.tensors) {
      if (shown == 8) {
        some += ", ...";
        break;
      }
      some += (shown++ ? ", \"" : "\"") + t.name + "\"";
    }
    detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", name, "\" is not in the file (it has ",
                 header_.tensors.size(), " tensors: ", some.empty() ? std::string("none") : some,
                 "); check the name, or load the file the model was saved to");
  }

  /// The stored shape as shardwise extents (at most max_rank dimensions).
  [[nodiscard]] extents shape(std::string_view name) const { return to_extents(info(name)); }

  /// The tensor's bytes, in place in the mapping (little-endian, row-major, unaligned).
  [[nodiscard]] std::span<std::byte const> raw(std::string_view name) const {
    tensor_info const& t = info(name);
    return file_.bytes().subspan(header_.data_start + t.begin, t.bytes());
  }

  /// Every element, in row-major order.
  template <safetensors_element T>
  [[nodiscard]] std::vector<T> read(std::string_view name) const {
    tensor_info const& t = info(name);
    check_type<T>(t);
    std::vector<T> out(t.elements());  // bounded by the file's size: checked when parsed
    if constexpr (std::is_same_v<T, bool>) {
      // vector<bool> has no contiguous storage: decode element by element.
      auto const bytes = raw(name);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = bytes[i] != std::byte{0};
    } else {
      file_.will_need(header_.data_start + t.begin, t.bytes());
      detail::decode_elements(raw(name).data(), t.type, out.data(), out.size());
    }
    return out;
  }

  /// Copies the box of `size` at `offset` of tensor `name` into `out`, row-major and contiguous
  /// (size.elements() elements). Only the pages of the file that hold the box are read.
  template <safetensors_element T>
  void read_box(std::string_view name, extents const& offset, extents const& size, T* out) const {
    tensor_info const& t = info(name);
    check_type<T>(t);
    extents const full = to_extents(t);
    check_box(t, full, offset, size);
    std::size_t const stored = dtype_size(t.type);
    if (size.elements() == 0) return;
    // Read ahead exactly the bytes from the box's first element to its last.
    std::size_t first = 0, last = 0, stride = 1;
    for (std::size_t d = full.rank; d-- > 0;) {
      first += offset[d] * stride;
      last += (offset[d] + size[d] - 1) * stride;
      stride *= full[d];
    }
    file_.will_need(header_.data_start + t.begin + first * stored, (last + 1 - first) * stored);
    // Copied with pread (the mapping's pages stay untouched, so they add nothing to the resident memory):
    // straight into `out` when stored as T, else through a small buffer and converted.
    std::size_t const start = header_.data_start + t.begin;
    std::vector<std::byte> buffer;
    detail::for_each_run(size, detail::zero_offset(size.rank), full, offset, size, storage_order::row_major,
                         [&](std::size_t to, std::size_t from, std::size_t n) {
                           if (t.type == dtype_of<T> && !std::is_same_v<T, bool>) {
                             file_.read(start + from * stored, n * stored, out + to);
                             return;
                           }
                           constexpr std::size_t chunk = std::size_t(1) << 16;  // elements
                           buffer.resize(std::min(n, chunk) * stored);
                           for (std::size_t done = 0; done < n; done += chunk) {
                             std::size_t const k = std::min(chunk, n - done);
                             file_.read(start + (from + done) * stored, k * stored, buffer.data());
                             detail::decode_elements(buffer.data(), t.type, out + to + done, k);
                           }
                         });
  }

  /// Copies `length` bytes of tensor `name`'s data from byte `first` of it into `out` as stored (pread; the
  /// mapping's pages stay untouched).
  void read_bytes(std::string_view name, std::size_t first, std::size_t length, std::byte* out) const {
    tensor_info const& t = info(name);
    if (first > t.bytes() || length > t.bytes() - first)
      detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", name, "\" has ", t.bytes(), " bytes; bytes [",
                   first, ", ", first + length, ") go beyond them");
    file_.read(header_.data_start + t.begin + first, length, out);
  }

  /// Drops this process's mapped pages of tensor `name` (mapped_file::release): after a pass over it whole.
  void release(std::string_view name) const {
    tensor_info const& t = info(name);
    file_.release(header_.data_start + t.begin, t.bytes());
  }

  /// Asks the kernel to read tensor `name`'s bytes ahead, in the background (a hint).
  void will_need(std::string_view name) const {
    tensor_info const& t = info(name);
    file_.will_need(header_.data_start + t.begin, t.bytes());
  }

  /// Rows [first, first + count) of tensor `name` (along its first dimension), row-major, into `out`.
  template <safetensors_element T>
  void read_rows(std::string_view name, std::size_t first, std::size_t count, T* out) const {
    extents const full = shape(name);
    if (full.rank == 0)
      detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", name,
                   "\" is a scalar and has no rows; use read or read_box");
    extents offset = detail::zero_offset(full.rank);
    offset[0] = first;
    read_box(name, offset, detail::with_dim(full, 0, count), out);
  }

  /// The whole tensor as a new Tensor (Eigen, xtensor...), in the Tensor's own storage order.
  template <class Tensor>
  [[nodiscard]] Tensor load(std::string_view name) const {
    static_assert(detail::check_creatable_tensor<Tensor>());
    extents const full = shape(name);
    return load_box<Tensor>(name, detail::zero_offset(full.rank), full);
  }

  /// The box of `size` at `offset` as a new Tensor.
  template <class Tensor>
  [[nodiscard]] Tensor load_box(std::string_view name, extents const& offset, extents const& size) const {
    static_assert(detail::check_creatable_tensor<Tensor>());
    check_rank<Tensor>(name, size);
    Tensor t = make_tensor<Tensor>(size);
    fill(name, offset, size, t);
    return t;
  }

  /// Reads the whole tensor into `t`, whose shape must equal the stored shape.
  template <class Tensor>
  void load_into(std::string_view name, Tensor& t) const {
    static_assert(detail::check_tensor<Tensor>());
    extents const full = shape(name);
    load_box_into(name, detail::zero_offset(full.rank), t);
  }

  /// Reads the box at `offset` with the shape of `t` into `t`.
  template <class Tensor>
  void load_box_into(std::string_view name, extents const& offset, Tensor& t) const {
    static_assert(detail::check_tensor<Tensor>());
    extents const size = shape_of(t);
    check_rank<Tensor>(name, size);
    fill(name, offset, size, t);
  }

 private:
  template <class Tensor>
  void fill(std::string_view name, extents const& offset, extents const& size, Tensor& t) const {
    using T = element_t<Tensor>;
    static_assert(safetensors_element<T>,
                  "shardwise::safetensors: the tensor's element type has no safetensors dtype; use double, float, "
                  "float16, bfloat16, int64_t, int32_t, uint8_t or bool");
    if (detail::traits_of<Tensor>::order == storage_order::row_major || size.rank <= 1) {
      read_box(name, offset, size, data_of(t));
    } else {
      std::vector<T> rows(size.elements());  // a column-major destination: read row-major, then transpose
      read_box(name, offset, size, rows.data());
      T* out = data_of(t);
      detail::for_each_element_in_order(size, storage_order::col_major,
                                        [&](std::size_t from, std::size_t to) { out[to] = rows[from]; });
    }
  }

  template <class Tensor>
  void check_rank(std::string_view name, extents const& size) const {
    constexpr std::size_t rank = detail::traits_of<Tensor>::rank;
    extents const full = shape(name);
    if (rank != dynamic_rank && rank != full.rank)
      detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", name, "\" has shape ", full, " (rank ",
                   full.rank, ") but the destination has rank ", rank, "; load it into a tensor of rank ", full.rank);
    if (size.rank != full.rank)
      detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", name, "\" has shape ", full,
                   " but the box asked for has rank ", size.rank, "; give one size per dimension");
  }

  template <class T>
  void check_type(tensor_info const& t) const {
    if (!detail::can_read_as<T>(t.type))
      detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", t.name, "\" is stored as ",
                   dtype_name(t.type), " and cannot be read as ", dtype_name(dtype_of<T>),
                   "; read it with its own element type (floating types convert among F64, F32, F16, BF16 only "
                   "into float or double)");
  }

  void check_box(tensor_info const& t, extents const& full, extents const& offset, extents const& size) const {
    if (offset.rank != full.rank || size.rank != full.rank)
      detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", t.name, "\" has shape ", full,
                   " but the box has offset ", offset, " and size ", size, "; give one offset and size per dimension");
    for (std::size_t d = 0; d < full.rank; ++d)
      if (offset[d] > full[d] || size[d] > full[d] - offset[d])
        detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", t.name, "\" has shape ", full,
                     "; the box at offset ", offset, " of size ", size, " goes beyond it in dimension ", d,
                     "; ask for a box inside the tensor");
  }

  [[nodiscard]] extents to_extents(tensor_info const& t) const {
    if (t.shape.size() > max_rank)
      detail::fail("shardwise::safetensors: \"", path(), "\": tensor \"", t.name, "\" has ", t.shape.size(),
                   " dimensions; shardwise reads at most ", max_rank, " (read its bytes with raw() instead)");
    extents e;
    e.rank = t.shape.size();
    for (std::size_t d = 0; d < e.rank; ++d) e[d] = static_cast<std::size_t>(t.shape[d]);
    return e;
  }

  mapped_file file_;
  safetensors_header header_;
};

}  // namespace shardwise
