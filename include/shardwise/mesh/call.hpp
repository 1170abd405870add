#pragma once
// What every rank must agree on in one collective call: its kind, element type, reduction, root, dimensions,
// shape, and its number among the calls on that communicator. Every backend exchanges these records before
// any data moves (on the thread mesh, before any rank touches a peer's buffer) and every rank raises the same
// error when they differ, naming what each rank called.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

#include "shardwise/core/call_site.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/mesh/call_checks.hpp"
#include "shardwise/placement/chunk.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/tensor/box.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise::detail {

enum class collective_kind : std::uint8_t {
  all_reduce,
  all_gather,
  reduce_scatter,
  broadcast,
  all_to_all,
  gather_values,
  barrier,
  split,
  all_gather_start,  ///< sw::all_gather_start: a rank must not meet a blocking all_gather with it.
  all_to_all_rows    ///< sw::all_to_all_rows: rows sent to each rank in the counts the sender gives.
};

constexpr std::string_view kind_name(collective_kind kind) {
  constexpr std::array<std::string_view, 10> names{"all_reduce",       "all_gather",     "reduce_scatter", "broadcast",
                                                   "all_to_all",       "gather_values",  "barrier",        "split",
                                                   "all_gather_start", "all_to_all_rows"};
  return names[static_cast<std::size_t>(kind)];
}

constexpr std::string_view op_name(op_kind op) {
  constexpr std::array<std::string_view, 4> names{"sum", "avg", "max", "min"};
  return names[static_cast<std::size_t>(op)];
}

/// The spelling of T as the compiler prints it ("float", "Eigen::bfloat16"), the same in every process of
/// one program, so ranks can compare element types by name.
template <class T>
constexpr std::string_view type_name() {
  std::string_view const function = __PRETTY_FUNCTION__;  // "... [with T = float; ...]" or "... [T = float]"
  std::size_t const start = function.find("T = ") + 4;
  std::size_t const end = function.find_first_of(";]", start);
  return function.substr(start, end - start);
}

/// The '\0'-terminated text in a fixed array (records that travel between processes hold text so).
template <std::size_t N>
std::string_view text_of(std::array<char, N> const& chars) {
  return {chars.data(), static_cast<std::size_t>(std::find(chars.begin(), chars.end(), '\0') - chars.begin())};
}

/// One rank's description of a collective call; plain bytes, so MPI can carry it.
struct call_record {
  std::uint64_t sequence = 0;  ///< The call's number on its communicator, counted by every rank.
  extents shape{};             ///< The shape of this rank's input (the root's, for broadcast).
  collective_kind kind{};
  op_kind op = op_kind::sum;  ///< all_reduce and reduce_scatter only.
  std::int16_t dim = -1;      ///< all_gather, reduce_scatter: the dimension; all_to_all: the split one.
  std::int16_t dim2 = -1;     ///< all_to_all: the concatenation dimension.
  std::int32_t root = -1;     ///< broadcast only.
  storage_order order = storage_order::row_major;  ///< The input's layout.
  bool pair_data = false;  ///< MPI, two ranks: this rank's data follows its record (all_gather of whole pieces).
  std::uint32_t line = 0;  ///< Where the call was made (0: unknown); not compared, only reported.
  /// The element type's name where make_call found it: within one process one string per type, so on the
  /// thread mesh its address identifies the type (see call_key). Meaningless to another process: a record
  /// sent to one carries the text itself (spelled()).
  char const* element_id = nullptr;
  std::uint32_t element_length = 0;  ///< The length of that name.
  char const* file_path = nullptr;   ///< The caller's file, in this process.
  std::array<char, 32> element{};    ///< spelled(): the element type's name, cut to fit; else empty.
  std::array<char, 48> file{};       ///< spelled(): the end of the caller's file path; else empty.

  /// The element type's name, cut to 31 characters (as sent).
  [[nodiscard]] std::string_view element_name() const {
    if (element[0] != '\0' || element_id == nullptr) return text_of(element);
    return {element_id, std::min<std::size_t>(element_length, element.size() - 1)};
  }
  /// The end of the caller's file path (as sent).
  [[nodiscard]] std::string_view file_name() const {
    if (file[0] != '\0' || file_path == nullptr) return text_of(file);
    std::string_view const path(file_path);
    return path.substr(path.size() - std::min(path.size(), file.size() - 1));
  }
  /// A copy that carries its texts itself, for another process (the thread mesh never needs them: copying
  /// them on every call showed in its per-call cost).
  [[nodiscard]] call_record spelled() const {
    call_record copy = *this;
    copy_text(element_name(), copy.element);
    copy_text(file_name(), copy.file);
    return copy;
  }
  /// Equal in everything but the shape, which each collective checks by its own rule.
  [[nodiscard]] bool same_call(call_record const& other) const {
    return sequence == other.sequence && kind == other.kind && op == other.op && dim == other.dim &&
           dim2 == other.dim2 && root == other.root && order == other.order && element_name() == other.element_name();
  }
  /// "all_gather<float>([4, 8], dim 0) at train.cpp:42".
  friend std::ostream& operator<<(std::ostream& out, call_record const& call) {
    call.print_arguments(out);
    if (call.line != 0) out << " at " << call.file_name() << ':' << call.line;
    return out;
  }

 private:
  template <std::size_t N>
  static void copy_text(std::string_view text, std::array<char, N>& chars) {
    std::size_t const kept = std::min(text.size(), N - 1);
    std::copy_n(text.begin(), kept, chars.begin());
    chars[kept] = '\0';
  }
  void print_arguments(std::ostream& out) const {
    if (kind == collective_kind::barrier || kind == collective_kind::split) {
      out << kind_name(kind) << "()";
      return;
    }
    out << kind_name(kind) << '<' << element_name() << ">(" << shape;
    switch (kind) {
      case collective_kind::all_reduce:
        out << ", " << op_name(op);
        break;
      case collective_kind::reduce_scatter:
        out << ", dim " << dim << ", " << op_name(op);
        break;
      case collective_kind::all_gather:
      case collective_kind::all_gather_start:
        out << ", dim " << dim;
        break;
      case collective_kind::broadcast:
        out << ", root " << root;
        break;
      case collective_kind::all_to_all:
        out << ", split dim " << dim << ", concat dim " << dim2;
        break;
      case collective_kind::all_to_all_rows:
        out << ", rows to each rank";
        break;
      default:
        break;
    }
    out << ')';
  }
};

/// The fields of a call that every rank must agree on (as same_call compares them), in four words. The thread
/// mesh compares these keys instead of whole records and reads a peer's record only to report a mismatch: a
/// record spans several cache lines of another core, and reading them on every call cost ~0.5 us. Equal keys
/// mean equal calls: the fields are packed whole, and equal element ids are one name string.
struct call_key {
  std::uint64_t sequence = 0;
  std::uint64_t kind_op_order_dim = 0;
  std::uint64_t dim2_root = 0;
  void const* element_id = nullptr;

  /// The key of `call`.
  static call_key of(call_record const& call) {
    auto const bits16 = [](std::int16_t v) { return static_cast<std::uint64_t>(static_cast<std::uint16_t>(v)); };
    call_key key;
    key.sequence = call.sequence;
    key.kind_op_order_dim = static_cast<std::uint64_t>(call.kind) | static_cast<std::uint64_t>(call.op) << 8 |
                            static_cast<std::uint64_t>(call.order) << 16 | bits16(call.dim) << 24;
    key.dim2_root = bits16(call.dim2) | static_cast<std::uint64_t>(static_cast<std::uint32_t>(call.root)) << 16;
    key.element_id = call.element_id;
    return key;
  }
  friend bool operator==(call_key const&, call_key const&) = default;
};

/// Copies the end of `text` into `chars` (the end of a path names the file), '\0'-terminated.
template <std::size_t N>
void copy_tail(std::string_view text, std::array<char, N>& chars) {
  std::size_t const kept = std::min(text.size(), N - 1);
  std::copy_n(text.end() - kept, kept, chars.begin());
}

/// The record of a call of `kind` on elements of type E with input shape `shape`; the caller fills in the
/// fields its kind uses.
template <class E, class Comm>
call_record make_call(Comm const& comm, collective_kind kind, extents const& shape, storage_order order,
                      call_site const& where) {
  call_record call;
  call.sequence = comm.next_call_number();
  call.shape = shape;
  call.kind = kind;
  call.order = order;
  constexpr std::string_view name = type_name<E>();
  call.element_id = name.data();
  call.element_length = static_cast<std::uint32_t>(name.size());
  call.line = where.line;
  call.file_path = where.file;
  return call;
}

/// Raises, on every rank alike, when the ranks' records describe different calls.
template <class RecordOf>
void check_calls_agree(int ranks, RecordOf&& record_of_rank, std::string_view axis) {
  call_record const& first = record_of_rank(0);
  for (int q = 1; q < ranks; ++q) {
    if (record_of_rank(q).same_call(first)) continue;
    std::ostringstream calls;
    for (int r = 0; r < ranks; ++r) {
      call_record const& call = record_of_rank(r);
      calls << (r ? "; " : "") << "rank " << r << " called " << call << " as call #" << call.sequence;
    }
    fail("shardwise: ranks called different collectives on mesh axis \"", axis, "\": ", calls.str(),
         ". Every rank of an axis must make the same collective calls in the same order, with the same element "
         "type, reduction, root and dimensions");
  }
}

/// A broadcast's root, once every rank agrees on it, must be a rank of the axis.
inline void check_root(int root, int ranks, collective_site const& site) {
  if (root < 0 || root >= ranks)
    fail(site, ": root rank ", root, " does not exist; the axis has ranks 0 to ", ranks - 1);
}

/// Shape rule of all_gather: shapes agree outside dimension d; the result stacks them along d in rank order.
template <class ShapeOf>
extents gathered_shape(int ranks, ShapeOf&& shape_of_rank, std::size_t d, collective_site const& site) {
  check_shapes_agree(ranks, shape_of_rank, d, site);
  std::size_t total = 0;
  for (int q = 0; q < ranks; ++q) total += shape_of_rank(q)[d];
  return with_dim(shape_of_rank(0), d, total);
}

/// The torch.chunk piece `q` of `shape` along d, cut for `ranks` ranks.
inline extents piece_of(extents const& shape, std::size_t d, int ranks, int q) {
  return with_dim(shape, d, chunk_size(shape[d], static_cast<std::size_t>(ranks), static_cast<std::size_t>(q)));
}

/// Where piece_of(shape, d, ranks, q) starts inside `shape`.
inline extents piece_offset(extents const& shape, std::size_t d, int ranks, int q) {
  return with_dim(zero_offset(shape.rank), d,
                  chunk_offset(shape[d], static_cast<std::size_t>(ranks), static_cast<std::size_t>(q)));
}

/// Shape rule of all_to_all: shapes agree outside the concatenation dimension; rank `me` receives piece `me`
/// (along the split dimension) of every rank's input, stacked along the concatenation dimension.
template <class ShapeOf>
extents all_to_all_shape(int ranks, int me, ShapeOf&& shape_of_rank, std::size_t split, std::size_t concat,
                         collective_site const& site) {
  check_shapes_agree(ranks, shape_of_rank, concat, site);
  extents result = piece_of(shape_of_rank(me), split, ranks, me);
  std::size_t total = 0;
  for (int q = 0; q < ranks; ++q) total += piece_of(shape_of_rank(q), split, ranks, me)[concat];
  result[concat] = total;
  return result;
}

/// The elements in one row (along dimension 0) of a tensor of `shape`.
inline std::size_t row_elements(extents const& shape) {
  std::size_t n = 1;
  for (std::size_t d = 1; d < shape.rank; ++d) n *= shape[d];
  return n;
}

/// The rows that `ranks` ranks exchange in an all_to_all_rows, checked alike on every rank: every rank passes rows
/// of one width, and its counts of rows for the ranks (rows_of(q)[j]: rank q's to rank j) add up to its rows.
/// Returns the shape of rank `me`'s result: the rows every rank sends it.
template <class ShapeOf, class RowsOf>
extents rows_to_ranks_shape(int ranks, int me, ShapeOf&& shape_of_rank, RowsOf&& rows_of, collective_site const& site) {
  check_shapes_agree(ranks, shape_of_rank, 0, site);
  std::size_t received = 0;
  for (int q = 0; q < ranks; ++q) {
    std::size_t const* rows = rows_of(q);
    std::size_t sent = 0;
    for (int j = 0; j < ranks; ++j) sent += rows[j];
    if (shape_of_rank(q).rank == 0 || sent != shape_of_rank(q)[0])
      fail(site, ": rank ", q, " sends ", sent, " rows to the ranks but holds ", shape_of_rank(q),
           "; give each rank's count of rows for every rank, adding up to the rows it holds, in rank order");
    received += rows[me];
  }
  return with_dim(shape_of_rank(me), 0, received);
}

}  // namespace shardwise::detail
