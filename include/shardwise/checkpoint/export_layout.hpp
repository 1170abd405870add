#pragma once
// consolidate's output under another program's names: which checkpoint tensors make up each output tensor, and
// where each one's elements go. The mapping is the one loading reads (sw::tensor_source), inverted: a tensor
// stored transposed is written transposed, tensors that are slices of one fused tensor (GPT-2's q, k and v of
// c_attn) are written side by side into it, and tensors stacked in one (transformers' fused experts, gate_up_proj
// [experts, 2 x hidden, dim]) each into its index of the first dimension.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/tensor_mapping.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/tensor/box.hpp"

namespace shardwise::detail {

/// A checkpoint tensor and where the mapping puts it.
struct export_member {
  checkpoint_tensor const* tensor = nullptr;
  tensor_source source;
};

/// One tensor of the output and the checkpoint tensors it is made of (ordered by their slice's start).
struct export_tensor {
  std::string name;
  dtype type = dtype::F32;
  std::vector<export_member> members;
  std::vector<std::uint64_t> model_shape;  ///< its shape as the model sees it: before transposing
  bool transposed = false;                 ///< written as model_shape's transpose (a matrix only)
  bool stacked = false;                    ///< its members stacked along a first dimension (model_shape[0] of them)

  /// The shape written to the file.
  [[nodiscard]] std::vector<std::uint64_t> file_shape() const {
    auto shape = model_shape;
    if (transposed) std::reverse(shape.begin(), shape.end());
    return shape;
  }
  /// Whether the output is one checkpoint tensor as it is (no transpose, no fusion): copied in place.
  [[nodiscard]] bool as_stored() const {
    return members.size() == 1 && !transposed && !stacked && members[0].source.slice_dim == -1;
  }
};

inline void fit_export_members(export_tensor& out);

/// The members of a stacked output, grouped by their index: each group fits as one tensor (fit_export_members),
/// every index from 0 is there, all of one shape; the output's shape is theirs with the count first.
inline void fit_stacked_members(export_tensor& out) {
  auto const who = [&](export_member const& m) { return concat("tensor \"", m.tensor->name, "\""); };
  std::map<std::int64_t, export_tensor> groups;
  for (auto const& m : out.members) {
    if (m.source.stacked_index < 0 || m.source.transpose)
      fail("shardwise::consolidate: ", who(m), " maps to \"", out.name, "\", whose other tensors are stacked (fused ",
           "experts), ", m.source.stacked_index < 0 ? "as a whole" : "transposed",
           "; map every tensor of it to one stacked index, untransposed");
    auto& group = groups[m.source.stacked_index];
    group.name = concat(out.name, "[", m.source.stacked_index, "]");
    group.members.push_back(m);
    group.members.back().source.stacked_index = -1;
  }
  std::int64_t next = 0;
  for (auto& [index, group] : groups) {
    fit_export_members(group);
    if (index != next || group.model_shape != groups.begin()->second.model_shape ||
        group.type != groups.begin()->second.type)
      fail("shardwise::consolidate: the tensors stacked in \"", out.name, "\" do not fill it: index ", index, " after ",
           next, " indices, or of another shape or type than index 0's; map every expert, each once");
    ++next;
  }
  if (groups.begin()->second.model_shape.size() >= max_rank)
    fail("shardwise::consolidate: the tensors stacked in \"", out.name, "\" have ",
         groups.begin()->second.model_shape.size(), " dimensions; stacked, they would have more than ", max_rank);
  out.stacked = true;
  out.type = groups.begin()->second.type;
  out.model_shape = groups.begin()->second.model_shape;
  out.model_shape.insert(out.model_shape.begin(), static_cast<std::uint64_t>(next));
}

/// Checks that the members of one output tensor fit together (one whole tensor, or slices that tile the fused
/// dimension from 0 without a gap or an overlap, all of one type and orientation) and sets its shape.
inline void fit_export_members(export_tensor& out) {
  auto const who = [&](export_member const& m) { return concat("tensor \"", m.tensor->name, "\""); };
  if (std::any_of(out.members.begin(), out.members.end(), [](auto const& m) { return m.source.stacked_index != -1; }))
    return fit_stacked_members(out);
  for (auto const& m : out.members)  // a whole tensor shares its output with nothing
    if (out.members.size() > 1 && m.source.slice_dim == -1)
      fail("shardwise::consolidate: ", who(m), " maps to the whole of \"", out.name, "\", which ",
           who(m.tensor == out.members[0].tensor ? out.members[1] : out.members[0]),
           " maps to as well; map each to its own tensor, or to slices of it");
  std::sort(out.members.begin(), out.members.end(),
            [](auto const& a, auto const& b) { return a.source.slice_start < b.source.slice_start; });
  auto const& first = out.members.front();
  out.type = first.tensor->type;
  out.model_shape = first.tensor->shape;
  out.transposed = first.source.transpose && out.model_shape.size() == 2;
  if (first.source.transpose && out.model_shape.size() > 2)
    fail("shardwise::consolidate: ", who(first), " has ", out.model_shape.size(),
         " dimensions; transpose takes a matrix: fix the mapping");
  int const d = first.source.slice_dim;
  if (d == -1) return;
  if (d < 0 || static_cast<std::size_t>(d) >= out.model_shape.size())
    fail("shardwise::consolidate: ", who(first), " maps to a slice along dimension ", d, " of \"", out.name,
         "\", which it does not have; fix the mapping's slice_dim");
  std::uint64_t next = 0;
  for (auto const& m : out.members) {
    auto shape = m.tensor->shape;
    bool const same_kind = m.tensor->type == out.type && m.source.transpose == first.source.transpose &&
                           m.source.slice_dim == d && shape.size() == out.model_shape.size();
    if (same_kind) shape[static_cast<std::size_t>(d)] = out.model_shape[static_cast<std::size_t>(d)];
    if (!same_kind || shape != out.model_shape)
      fail("shardwise::consolidate: ", who(m), " and ", who(first), " map to slices of \"", out.name,
           "\" but differ in type, shape, orientation or sliced dimension; fix the mapping");
    if (m.source.slice_start != next || m.source.slice_size != m.tensor->shape[static_cast<std::size_t>(d)])
      fail("shardwise::consolidate: the slices mapped to \"", out.name, "\" do not tile it: ", who(m), " is [",
           m.source.slice_start, ", ", m.source.slice_start + m.source.slice_size, ") along dimension ", d, " with ",
           m.tensor->shape[static_cast<std::size_t>(d)], " rows, after [0, ", next,
           "); map every slice of it, each once");
    next += m.source.slice_size;
  }
  for (auto const& m : out.members)
    if (m.source.slice_of != 0 && m.source.slice_of != next)
      fail("shardwise::consolidate: the slices mapped to \"", out.name, "\" cover [0, ", next, ") of its ",
           m.source.slice_of, " along dimension ", d, " (", who(m), " says so); map every slice of it, each once");
  out.model_shape[static_cast<std::size_t>(d)] = next;
}

/// The output tensors of `weights` under `mapping`, each checked (fit_export_members). A tensor the mapping gives
/// no name is an error: consolidate never drops a weight silently.
inline std::vector<export_tensor> plan_export(std::vector<checkpoint_tensor const*> const& weights,
                                              checkpoint_mapping const& mapping) {
  std::map<std::string, export_tensor> by_name;
  for (auto const* t : weights) {
    auto source = mapping(t->name);
    if (!source)
      fail("shardwise::consolidate: the mapping gives tensor \"", t->name,
           "\" no name in the output; map it, or consolidate under shardwise's own names");
    auto& out = by_name[source->name];
    out.name = source->name;
    out.members.push_back({t, std::move(*source)});
  }
  std::vector<export_tensor> result;
  for (auto& [name, out] : by_name) {
    fit_export_members(out);
    result.push_back(std::move(out));
  }
  return result;
}

/// Copies one member's elements (`bytes`: its whole row-major tensor) to their place in the output's bytes.
inline void place_export_member(export_tensor const& out, export_member const& m, std::span<std::byte const> bytes,
                                std::span<std::byte> file) {
  std::size_t const element = dtype_size(out.type), rank = out.model_shape.size();
  std::size_t const first = out.stacked ? 1 : 0;  // stacked: the member is one index of the first dimension
  extents full, offset, size;
  full.rank = offset.rank = size.rank = rank;
  for (std::size_t d = 0; d < rank; ++d) {
    full[d] = static_cast<std::size_t>(out.model_shape[d]);
    size[d] = d < first ? 1 : static_cast<std::size_t>(m.tensor->shape[d - first]);
  }
  if (out.stacked) offset[0] = static_cast<std::size_t>(m.source.stacked_index);
  if (m.source.slice_dim != -1) offset[static_cast<std::size_t>(m.source.slice_dim) + first] = m.source.slice_start;
  if (!out.transposed) {
    for_each_run(full, offset, size, zero_offset(rank), size, storage_order::row_major,
                 [&](std::size_t to, std::size_t from, std::size_t n) {
                   std::memcpy(file.data() + to * element, bytes.data() + from * element, n * element);
                 });
    return;
  }
  for (std::size_t i = 0; i < size[0]; ++i)  // model [i][j] -> file [j][i]: the file holds the transpose
    for (std::size_t j = 0; j < size[1]; ++j)
      std::memcpy(file.data() + ((j + offset[1]) * full[0] + i + offset[0]) * element,
                  bytes.data() + (i * size[1] + j) * element, element);
}

}  // namespace shardwise::detail
