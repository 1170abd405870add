#pragma once
// The two lines a module or layer writes to join shardwise: its children (plans, checkpoints, optimizers walk
// them) and what its forward keeps for its backward (pipeline schedules and activation checkpointing move it).
#include <string_view>
#include <tuple>

/// Inside a module: SHARDWISE_CHILDREN(w1, w3, w2) names the members that are layers or modules.
#define SHARDWISE_CHILDREN(...)                                          \
  static constexpr std::string_view shardwise_child_list = #__VA_ARGS__; \
  constexpr auto shardwise_children() { return std::tie(__VA_ARGS__); }  \
  constexpr auto shardwise_children() const { return std::tie(__VA_ARGS__); }

/// Inside a module or layer: SHARDWISE_SAVED(h1_, h3_, a_) names the members its forward fills for its
/// backward (SHARDWISE_SAVED() if it keeps none), so that several microbatches can be in flight
/// (sw::saved_activations moves them out and back) and activation checkpointing can drop them.
#define SHARDWISE_SAVED(...) \
  constexpr auto shardwise_saved() { return std::tie(__VA_ARGS__); }
