// Checkpoints under FSDP on the thread mesh at 1, 2 and 4 ranks: saved under one dp x tp and loaded under
// another, from the sharded folder and from its consolidated file (cases/fsdp_checkpoint_cases.hpp).
#include <doctest/doctest.h>

#include <filesystem>
#include <shardwise/shardwise.hpp>

#include "cases/fsdp_checkpoint_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("FSDP checkpoints load under another dp x tp and consolidate, thread mesh") {
  auto const root = std::filesystem::temp_directory_path() / "shardwise_test_fsdp_checkpoint";
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    worlds::run_threads(ranks, [&](auto& world) { fsdp_checkpoint_cases::check_all(world, root); });
  }
}
