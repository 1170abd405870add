#pragma once
// Which ranks take turns reading a checkpoint under load_options::ranks_per_step. By default the ranks of the
// load's tp group; with sw::node_turns(world), every rank of this node — across tp groups and data-parallel
// replicas — as optimum-neuron's num_local_ranks_per_step counts them: what the turns bound (concurrent disk and
// page-cache traffic, host memory) belongs to the node, not to one tp group.
#include <unistd.h>

#include <array>
#include <cstddef>
#include <functional>
#include <memory>
#include <string_view>
#include <vector>

#include "shardwise/collectives/collectives.hpp"

namespace shardwise {

/// The ranks that take turns reading (load_options::turns): this rank's place among them, how many there are, and
/// a barrier over them that closes each turn.
struct read_turns {
  int rank = 0;                   ///< This rank's place among them.
  int size = 1;                   ///< How many take turns.
  std::function<void()> barrier;  ///< Waits until every one of them has finished the turn (collective).
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
/// ranks_per_step, so that at most that many ranks of a node read at once whatever their tp group or replica.
/// Collective over `world`; on the thread mesh every rank is on one node.
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
  return turns;
}

}  // namespace shardwise
