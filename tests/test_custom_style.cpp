// A parallel style written in the test, not in the library (cases/custom_style_cases.hpp), on the thread mesh at
// 1, 2 and 4 ranks; test_mpi_custom_style.cpp runs the same cases under mpiexec.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "cases/custom_style_cases.hpp"
#include "support/worlds.hpp"

TEST_CASE("a style written outside the library trains like the unsharded block, its cost recorded, threads") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: ", n);
    worlds::run_threads(n, [](auto& world) { custom_style_cases::trains_like_the_unsharded_block(world); });
  }
}

TEST_CASE("a style written outside the library round-trips a sharded checkpoint, threads") {
  for (int n : {1, 2, 4}) {
    INFO("ranks: ", n);
    auto const dir = std::filesystem::current_path() / ("custom_style_threads_" + std::to_string(n));
    std::filesystem::remove_all(dir);
    worlds::run_threads(n, [&](auto& world) { custom_style_cases::checkpoint_round_trip(world, dir); });
  }
}
