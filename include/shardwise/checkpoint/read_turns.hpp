#pragma once
// Which ranks take turns reading a checkpoint under load_options::ranks_per_step, or share one reader under
// only_rank0_reads. By default the ranks of the load's tp group; with sw::node_turns(world), every rank of this
// node — across tp groups, data-parallel replicas and pipeline stages — as optimum-neuron's
// num_local_ranks_per_step counts them: what the turns bound (concurrent disk and page-cache traffic, host
// memory) belongs to the node, not to one tp group.
#include <unistd.h>

#include <Eigen/Core>
#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "shardwise/mesh/collectives.hpp"

namespace shardwise {

/// The ranks that take turns reading (load_options::turns): this rank's place among them, how many there are, a
/// barrier over them that closes each turn, and messages between them (for only_rank0_reads: the first of them
/// reads for all).
struct read_turns {
  int rank = 0;                   ///< This rank's place among them.
  int size = 1;                   ///< How many take turns.
  std::function<void()> barrier;  ///< Waits until every one of them has finished the turn (collective).
  /// Sends `bytes` bytes at `data` to the one of them at place `to` (delivered in order, per sender).
  std::function<void(void const* data, std::size_t bytes, int to)> send;
  /// Receives the next message from place `from` into where(bytes) (which returns room for `bytes` bytes).
  std::function<void(int from, std::function<void*(std::size_t bytes)> const& where)> receive;
  int world_rank = 0;  ///< This rank's place in the world the turns were made from (sw::node_turns).
  int world_size = 1;  ///< That world's size.
  /// Element-wise maximum over every rank of that world (collective over it): load_sharded agrees there whether
  /// to retry, since ranks that share turns or a reader but no mesh axis must retry together, or none of them
  /// (a rank retrying alone would wait for the others until the timeout). Null (turns built by hand): the load's
  /// mesh axes alone agree.
  std::function<void(Eigen::VectorXd& values)> max_over_world;
};

namespace detail {
/// A host's name, fixed-size so that the ranks can gather it.
struct host_name {
  std::array<char, 256> text{};
  [[nodiscard]] std::string_view view() const { return {text.data()}; }
};
}  // namespace detail

/// The ranks of `world` (a communicator: the thread world, MPI's, a runtime one) on this rank's node, grouped by
/// host name as MPI's shared-memory split groups them, to take turns over: pass it as load_options::turns with
/// ranks_per_step, so that at most that many ranks of a node read at once whatever their tp group or replica, or
/// with only_rank0_reads, so that the node's first rank alone reads, for all of them. Collective over `world`; on
/// the thread mesh every rank is on one node. Every rank of `world` must then load the checkpoint: a load agrees
/// over the whole world whether to read it again (a save replaced it meanwhile).
template <class Comm>
std::shared_ptr<read_turns const> node_turns(Comm const& world) {
  detail::host_name mine;
  if (gethostname(mine.text.data(), mine.text.size() - 1) != 0) mine.text = {};  // unnamed: one node, as threads
  std::vector<detail::host_name> const all = gather_values(world, mine);
  int color = 0;  // the first rank on this host names the node
  while (all[static_cast<std::size_t>(color)].view() != mine.view()) ++color;
  auto node = world.split(color, world.rank(), "node");
  auto turns = std::make_shared<read_turns>();
  turns->rank = node.rank(), turns->size = node.size();
  turns->barrier = [node] { node.barrier(); };
  turns->send = [node](void const* data, std::size_t bytes, int to) { node.send_bytes(data, bytes, {bytes}, to, 0); };
  turns->receive = [node](int from, std::function<void*(std::size_t)> const& where) {
    node.recv_into(from, 0, [&](extents const&, std::size_t bytes) -> void* { return where(bytes); });
  };
  turns->world_rank = world.rank(), turns->world_size = world.size();
  turns->max_over_world = [world](Eigen::VectorXd& values) {
    detail::all_reduce_on(world, values, detail::op_kind::max);
  };
  return turns;
}

}  // namespace shardwise
