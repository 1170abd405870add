#pragma once
// What the backends and the collectives share about one call: where it runs (for messages), dimension checks,
// shape agreement across ranks, and where its result goes (sized once the ranks agree on it).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/fold_hash.hpp"
#include "shardwise/tensor/concept.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise::detail {

/// Where a collective runs, for error messages: "all_gather on mesh axis \"tp\"".
struct collective_site {
  char const* name;
  std::string_view axis;
};

inline std::ostream& operator<<(std::ostream& out, collective_site const& site) {
  return out << "shardwise::" << site.name << " on mesh axis \"" << site.axis << "\"";
}

/// Dimension `dim` (negative counts from the end) of a rank-`rank` tensor, or an error naming the valid range.
inline std::size_t normalize_dim(int dim, std::size_t rank, collective_site const& site) {
  auto const r = static_cast<int>(rank);
  int const d = dim < 0 ? dim + r : dim;
  if (d < 0 || d >= r)
    fail(site, ": dimension ", dim, " does not exist in a tensor of rank ", rank, "; use a dimension in [", -r, ", ",
         r - 1, "]");
  return static_cast<std::size_t>(d);
}

/// Elements before dimension d in memory order: how many separate rows a slice along d consists of.
inline std::size_t rows_outside(extents const& shape, std::size_t d, storage_order order) {
  std::size_t rows = 1;
  if (order == storage_order::row_major)
    for (std::size_t i = 0; i < d; ++i) rows *= shape[i];
  else
    for (std::size_t i = d + 1; i < shape.rank; ++i) rows *= shape[i];
  return rows;
}

template <class ShapeOf>
std::string describe_shapes(int ranks, ShapeOf&& shape_of_rank) {
  std::ostringstream out;
  for (int q = 0; q < ranks; ++q) out << (q ? ", " : "") << "rank " << q << " has " << shape_of_rank(q);
  return out.str();
}

/// Every rank must pass the same shape, except possibly along dimension `free_dim` (or none: rank).
template <class ShapeOf>
void check_shapes_agree(int ranks, ShapeOf&& shape_of_rank, std::size_t free_dim, collective_site const& site) {
  extents const first = shape_of_rank(0);
  for (int q = 1; q < ranks; ++q) {
    extents const other = shape_of_rank(q);
    bool same = other.rank == first.rank;
    for (std::size_t i = 0; same && i < first.rank; ++i) same = i == free_dim || other[i] == first[i];
    if (!same) {
      if (free_dim < first.rank)
        fail(site, ": shapes differ across ranks outside dimension ", free_dim, ": ",
             describe_shapes(ranks, shape_of_rank), "; every rank must pass tensors that differ only along dimension ",
             free_dim);
      fail(site, ": shapes differ across ranks: ", describe_shapes(ranks, shape_of_rank),
           "; every rank must pass a tensor of the same shape");
    }
  }
}

/// The shape outside dimension `free_dim` (and the rank and free_dim themselves) folded into 64 bits.
inline std::uint64_t shape_fingerprint(extents const& shape, std::size_t free_dim) {
  std::uint64_t h = fold_hash(shape.rank, free_dim);
  for (std::size_t i = 0; i < shape.rank; ++i) h = fold_hash(h, i == free_dim ? ~std::uint64_t{0} : shape[i]);
  return h;
}

/// Gives `out` the shape `wanted`: resized when shardwise can create the type, otherwise it must already fit.
template <class T>
void prepare_output(T& out, extents const& wanted, collective_site const& site) {
  if (shape_of(out) == wanted) return;
  if constexpr (creatable_tensor<T>) {
    out = make_tensor<T>(wanted);
  } else {
    fail(site, ": the output has shape ", shape_of(out), " but must have ", wanted,
         "; pass an output of that shape, or an owning tensor type shardwise can resize");
  }
}

template <class In, class Out>
void check_not_aliased(In const& in, Out const& out, collective_site const& site) {
  if (static_cast<void const*>(std::addressof(in)) == static_cast<void const*>(std::addressof(out)))
    fail(site, ": input and output are the same tensor; pass a separate output");
}

template <class In, class Out>
constexpr void check_same_element() {
  static_assert(std::is_same_v<element_t<In>, element_t<Out>>,
                "shardwise::collective: input and output tensors must have the same element type");
  if constexpr (rank_v<In> != dynamic_rank && rank_v<Out> != dynamic_rank)
    static_assert(rank_v<In> == rank_v<Out>, "shardwise::collective: input and output tensors must have the same rank");
  static_assert(traits_of<In>::order == traits_of<Out>::order,
                "shardwise::collective: input and output tensors must have the same storage order (both row-major "
                "or both column-major)");
}

template <class Comm>
collective_site site_of(Comm const& comm, char const* name) {
  return {name, comm.label()};
}

/// Where a collective's result goes: a tensor, sized to the result's shape once the ranks have agreed on it.
/// One type per element type, whatever the tensor's, so each backend's algorithms are compiled once per element
/// type (they were once per tensor type: a tenth of a training program's build).
template <class E>
class output_ref {
 public:
  template <class Out>
  output_ref(Out& out, collective_site const& site)
      : out_(&out), site_(&site), prepare_([](void* target, extents const& result, collective_site const& at) -> E* {
          Out& tensor = *static_cast<Out*>(target);
          prepare_output(tensor, result, at);
          return data_of(tensor);
        }) {}
  /// Sizes the tensor to `result` and returns where its elements go.
  E* operator()(extents const& result) const { return prepare_(out_, result, *site_); }

 private:
  void* out_;
  collective_site const* site_;
  E* (*prepare_)(void*, extents const&, collective_site const&);
};

template <class Out>
output_ref<element_t<Out>> output_into(Out& out, collective_site const& site) {
  return {out, site};
}

/// A point-to-point receive staged in a buffer of its own: comm.recv_into lands the message there, then
/// take(shape, bytes) gets it (the backends whose transfer writes straight to where the caller says).
template <class Comm, class Take>
void receive_staged(Comm const& comm, int source, int tag, Take&& take) {
  extents shape;
  std::vector<unsigned char> data;
  comm.recv_into(source, tag, [&](extents const& sent, std::size_t bytes) -> void* {
    shape = sent;
    data.resize(bytes);
    return data.data();
  });
  take(shape, data);
}

}  // namespace shardwise::detail
