#pragma once
// A sharded load's verdict on one attempt, agreed by every rank that loads together: done, read again (a save
// replaced the folder meanwhile) or failed with the first failing rank's words. load_sharded (sharded_load.hpp)
// takes it after each attempt, so that the ranks retry together or fail together and none waits for a peer.
#include <Eigen/Core>
#include <cstdint>
#include <filesystem>
#include <string>

#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/read_turns.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/mesh/collectives.hpp"

namespace shardwise::detail {
/// One attempt of load_sharded on this rank: what it read, or why not.
struct load_attempt {
  int status = 0;  // 0 read, 1 the folder changed under this rank, 2 failed
  std::string error;
  checkpoint_index index;
};

/// A load's verdict on an attempt: done, read again (a save replaced the folder meanwhile), or failed.
enum class load_verdict { done = 0, retry = 1, failed = 2 };

/// The verdict of the ranks of `agreeing` (every axis whose ranks load together): done when every one read the
/// same save (its generation), failed when one failed or `last`.
template <class... Agreeing>
load_verdict agreed_verdict(load_attempt const& a, bool last, Agreeing const&... agreeing) {
  int worst = a.status;
  std::uint64_t newest = a.status == 0 ? a.index.generation : 0;
  std::uint64_t oldest = a.status == 0 ? a.index.generation : ~std::uint64_t{0};
  ((worst = all_reduce(agreeing, worst, Max{}), newest = all_reduce(agreeing, newest, Max{}),
    oldest = all_reduce(agreeing, oldest, Min{})),
   ...);
  if (worst == 0 && newest == oldest) return load_verdict::done;
  return worst == 2 || last ? load_verdict::failed : load_verdict::retry;
}

/// The words of a load whose every attempt found the folder replaced by a save.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string replaced_every_time(std::filesystem::path const& dir, int attempts);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY std::string replaced_every_time(std::filesystem::path const& dir, int attempts) {
  return concat("shardwise::load_sharded: \"", dir.string(), "\" was replaced by other saves during ", attempts,
                " reads in a row; load it when no save runs, or from a copy");
}
#endif

/// Raises on every rank of `agreeing` the words of a failed load: the first failing rank's error, or (every rank
/// having read, but not the same save) that saves kept replacing the folder.
template <class... Agreeing>
[[noreturn]] void raise_failed_load(load_attempt const& a, std::string const& replaced,
                                    std::filesystem::path const& dir, Agreeing const&... agreeing) {
  auto const agree = [&](std::string const& message) {
    agree_on_errors_across(message, "reading the checkpoint", dir, "load_sharded", agreeing...);
  };
  agree(a.status == 0 ? std::string() : a.error);
  agree(((agreeing.rank() == 0) && ...) ? replaced : std::string());
  throw shardwise::error(replaced);  // one rank, agreeing over no axis: agree raised nothing
}

/// Splits a generation into two 32-bit halves, each exact in a double, for an element-wise maximum.
inline void put_generation(Eigen::VectorXd& v, Eigen::Index at, std::uint64_t g, double sign) {
  v(at) = sign * static_cast<double>(g >> 32), v(at + 1) = sign * static_cast<double>(g & 0xffffffffu);
}

/// The verdict over the whole world of `turns` (sw::node_turns), taken by every rank: a node's ranks share turns
/// or a reader across mesh groups, so a group may retry only if every group does. Done needs every rank to have
/// read one save; failed raises the first failing rank's words (by world rank) on every rank.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY load_verdict world_verdict(read_turns const& turns, load_verdict group,
                                                             load_attempt const& a, bool last,
                                                             std::string const& failure, std::string const& replaced);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY load_verdict world_verdict(read_turns const& turns, load_verdict group,
                                                             load_attempt const& a, bool last,
                                                             std::string const& failure, std::string const& replaced) {
  Eigen::VectorXd v(6);
  v(0) = static_cast<double>(group);
  bool const read = a.status == 0;  // a rank without a generation leaves the comparison to the others
  put_generation(v, 1, read ? a.index.generation : 0, 1);
  put_generation(v, 3, read ? a.index.generation : ~std::uint64_t{0}, -1);
  v(5) = failure.empty() ? 0 : static_cast<double>(turns.world_size - turns.world_rank);
  turns.max_over_world(v);
  auto verdict = static_cast<load_verdict>(static_cast<int>(v(0)));
  if (verdict == load_verdict::done && (v(1) != -v(3) || v(2) != -v(4)))
    verdict = last ? load_verdict::failed : load_verdict::retry;  // groups read different saves
  if (verdict != load_verdict::failed) return verdict;
  int const source = v(5) == 0 ? 0 : turns.world_size - static_cast<int>(v(5));
  constexpr std::size_t longest = 2048;
  Eigen::VectorXd text = Eigen::VectorXd::Zero(static_cast<Eigen::Index>(longest));
  std::string message = v(5) == 0 ? replaced : failure;
  for (std::size_t i = 0; turns.world_rank == source && i < message.size() && i < longest; ++i)
    text(static_cast<Eigen::Index>(i)) = static_cast<double>(static_cast<unsigned char>(message[i]));
  turns.max_over_world(text);  // only the source wrote: the maximum is its message
  message.clear();
  for (Eigen::Index i = 0; i < text.size() && text(i) != 0.0; ++i)
    message.push_back(static_cast<char>(static_cast<unsigned char>(text(i))));
  throw shardwise::error(message);
}
#endif

}  // namespace shardwise::detail
