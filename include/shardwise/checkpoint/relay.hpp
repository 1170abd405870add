#pragma once
// load_options::only_rank0_reads under FSDP (Accelerate's fsdp2_load_full_state_dict): the first rank of the
// dp x tp grid reads every rank's shard of a tensor from the files and sends it on, so that no other rank reads
// tensor data or holds more than its own shard. A rank's shard is a box of the tensor that only it knows (FSDP's
// rows are uneven, and cut within a tp block), so the boxes travel to the reader first.
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/mesh/collectives.hpp"

namespace shardwise::detail {

/// The part of a layout that differs between the ranks holding a tensor (its box), as a message.
inline Eigen::VectorXd box_of(tensor_layout const& t) {
  Eigen::VectorXd box(4);
  box << static_cast<double>(t.row_offset), static_cast<double>(t.local_rows), static_cast<double>(t.col_offset),
      static_cast<double>(t.local_cols);
  return box;
}

/// Layout t moved to another rank's box.
inline tensor_layout with_box(tensor_layout t, Eigen::VectorXd const& box) {
  t.row_offset = static_cast<std::size_t>(box(0));
  t.local_rows = static_cast<std::size_t>(box(1));
  t.col_offset = static_cast<std::size_t>(box(2));
  t.local_cols = static_cast<std::size_t>(box(3));
  return t;
}

/// Calls fn(axes...) with the axes a model under FSDP loads over: tp (when it is a mesh), dp, and the replicate
/// axis of hybrid sharding.
template <class Model, class Tp, class Fn>
decltype(auto) with_fsdp_axes(Model& model, Tp const& tp, Fn&& fn) {
  auto const with_replicas = [&](auto const&... axes) -> decltype(auto) {
    if constexpr (requires { model.replicate_mesh(); })
      return fn(axes..., model.replicate_mesh());
    else
      return fn(axes...);
  };
  if constexpr (requires { tp.comm(0); })
    return with_replicas(tp, model.data_mesh());
  else
    return with_replicas(model.data_mesh());
}

/// The boxes of tensor t on every rank, known to the reader (dp rank 0 of tp rank 0): each dp column's boxes
/// gather to its dp rank 0, which sends them on over tp. Element [b].col(a) is dp rank a of tp rank b's box.
template <class Tp, class Dp>
std::vector<Eigen::MatrixXd> boxes_at_reader(Tp const& tp, Dp const& dp, tensor_layout const& t) {
  Eigen::MatrixXd column(4, dp.size());
  column.col(0) = box_of(t);
  if (dp.rank() != 0) {
    send(dp, column.col(0).eval(), 0);
    return {};
  }
  for (int a = 1; a < dp.size(); ++a) {
    Eigen::VectorXd box;
    recv(dp, box, a);
    column.col(a) = box;
  }
  std::vector<Eigen::MatrixXd> columns{column};
  if constexpr (requires { tp.comm(0); }) {
    if (tp.rank() != 0) {
      send(tp, column, 0);
      return {};
    }
    columns.resize(static_cast<std::size_t>(tp.size()));
    for (int b = 1; b < tp.size(); ++b) recv(tp, columns[static_cast<std::size_t>(b)], b);
  }
  return columns;
}

/// One tensor under only_rank0_reads: the reader reads every rank's box with read(layout, block) (into a zeroed
/// block; it records its own errors) and sends it back the way the boxes came, one block in flight at a time;
/// `value` ends as this rank's shard.
template <class Tp, class Dp, class Tensor, class Read>
void relay_from_reader(Tp const& tp, Dp const& dp, tensor_layout const& t, Tensor& value, Read&& read) {
  std::vector<Eigen::MatrixXd> const columns = boxes_at_reader(tp, dp, t);
  bool const reader = !columns.empty();
  auto const deliver = [&](int a, Tensor& block) {  // within the dp column: dp rank 0 keeps its own, last
    if (a == 0)
      value = std::move(block);
    else
      send(dp, block, a);
  };
  if (reader) {
    for (int b = static_cast<int>(columns.size()) - 1; b >= 0; --b) {
      for (int a = dp.size() - 1; a >= 0; --a) {
        tensor_layout const theirs = with_box(t, columns[static_cast<std::size_t>(b)].col(a));
        Tensor block =
            Tensor::Zero(static_cast<Eigen::Index>(theirs.local_rows), static_cast<Eigen::Index>(theirs.local_cols));
        read(theirs, block);
        if constexpr (requires { tp.comm(0); })
          if (b != 0) {
            send(tp, block, b);
            continue;
          }
        deliver(a, block);
      }
    }
  } else if (dp.rank() == 0) {  // a dp column's first rank: passes its column's blocks on
    if constexpr (requires { tp.comm(0); })
      for (int a = dp.size() - 1; a >= 0; --a) {
        Tensor block;
        recv(tp, block, 0);
        deliver(a, block);
      }
  } else {
    recv(dp, value, 0);
  }
}

/// Every tensor of a model under FSDP that the checkpoint holds (held(name)), read on the first rank by
/// read(layout, block, error) and relayed to the rank whose shard it is; the replicas of hybrid sharding receive
/// the first replica's shards. A block the reader cannot read goes out as zeros, so that no rank waits for one
/// that will not come, and its error is raised on every rank once the tensor is through.
template <class Model, class Tp, class Read, class Held>
void relay_shards(Model& model, Tp const& tp, std::filesystem::path const& dir, std::string_view who, Read&& read,
                  Held&& held) {
  with_fsdp_axes(model, tp, [&](auto const&... axes) {
    bool const reader = ((axes.rank() == 0) && ...);
    if (reader && checkpoint_load_hook) checkpoint_load_hook("read_begin", 0);
    for_each_checkpoint_tensor(model, tp.size(), tp.rank(), true, [&](tensor_layout const& t, auto& value) {
      if (!held(t.name)) return;  // missing (non-strict): skipped alike on every rank
      std::string error;
      if (model.replica() == 0)
        relay_from_reader(tp, model.data_mesh(), t, value, [&](tensor_layout const& theirs, auto& block) {
          if (error.empty()) read(theirs, block, error);
        });
      if constexpr (requires { model.replicate_mesh(); }) broadcast(model.replicate_mesh(), value, 0);
      agree_on_errors_across(error, "reading a tensor on the first rank", dir, who, axes...);
    });
    if (reader && checkpoint_load_hook) checkpoint_load_hook("read_end", 0);
  });
}

}  // namespace shardwise::detail
