// The thread mesh's promises: a failure on one rank reaches every rank (never a hang), and a rank that leaves
// while others wait for it is named.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
#include <stdexcept>
#include <string>
#include <thread>

namespace sw = shardwise;

TEST_CASE("an exception on one rank is rethrown by run_threads while its peers wait in a collective") {
  for (int n : {2, 4, 8}) {  // 8 threads on 2 cores: waiting ranks sleep, they do not spin forever
    CAPTURE(n);
    std::atomic<int> released{0};
    CHECK_THROWS_WITH_AS(sw::run_threads(n,
                                         [&](auto& world) {
                                           auto mesh = sw::make_mesh<"tp">(world, {world.size()});
                                           if (world.rank() == n - 1)
                                             throw std::runtime_error("rank failed on purpose");
                                           Eigen::VectorXf v = Eigen::VectorXf::Ones(16);
                                           try {
                                             sw::all_reduce(mesh, v);
                                           } catch (...) {
                                             ++released;
                                             throw;
                                           }
                                         }),
                         "rank failed on purpose", std::runtime_error);
    CHECK(released == n - 1);
  }
}

TEST_CASE("a rank that returns while its peers wait in a collective is reported, not waited for") {
  CHECK_THROWS_WITH_AS(sw::run_threads(3,
                                       [](auto& world) {
                                         auto mesh = sw::make_mesh<"tp">(world, {world.size()});
                                         if (world.rank() == 1) return;
                                         Eigen::VectorXf v = Eigen::VectorXf::Ones(4);
                                         sw::all_reduce(mesh, v);
                                       }),
                       doctest::Contains("rank 1 of mesh axis \"tp\" returned from its function while rank"),
                       sw::error);
}

TEST_CASE("recv from a rank that returned without sending is reported") {
  CHECK_THROWS_WITH_AS(sw::run_threads(2,
                                       [](auto& world) {
                                         auto mesh = sw::make_mesh<"tp">(world, {2});
                                         if (world.rank() == 0) return;
                                         Eigen::VectorXf v;
                                         sw::recv(mesh, v, 0, 3);
                                       }),
                       "shardwise::recv on mesh axis \"tp\": rank 0 returned from its function without sending the "
                       "message rank 1 waits for (tag 3)",
                       sw::error);
}

TEST_CASE("run_threads runs every rank once, rank 0 on the calling thread") {
  std::atomic<int> sum{0};
  auto const caller = std::this_thread::get_id();
  bool rank0_on_caller = false;
  sw::run_threads(5, [&](auto& world) {
    sum += world.rank() + 1;
    if (world.rank() == 0) rank0_on_caller = std::this_thread::get_id() == caller;
    CHECK(world.size() == 5);
  });
  CHECK(sum == 15);
  CHECK(rank0_on_caller);
  CHECK_THROWS_WITH_AS(sw::run_threads(0, [](auto&) {}), "shardwise::run_threads: needs at least 1 rank, got 0",
                       sw::error);
}

TEST_CASE("many collectives in a row stay in step (barrier generations)") {
  sw::run_threads(4, [](auto& world) {
    auto mesh = sw::make_mesh<"dp", "tp">(world, {2, 2});
    auto tp = mesh.template axis<"tp">();
    auto dp = mesh.template axis<"dp">();
    Eigen::VectorXd v(3);
    for (int i = 0; i < 2000; ++i) {
      v.setConstant(world.rank() + i);
      if (i % 2)
        sw::all_reduce(tp, v);
      else
        sw::all_reduce(dp, v);
      int const expected = i % 2 ? 2 * (world.rank() / 2 * 2) + 1 + 2 * i : 2 * (world.rank() % 2) + 2 + 2 * i;
      REQUIRE(v(2) == expected);
    }
  });
}

TEST_CASE("SHARDWISE_WAIT_NOTICE sets when a long wait is first reported; a bad value is refused by name") {
  using std::chrono::milliseconds;
  ::unsetenv("SHARDWISE_WAIT_NOTICE");
  CHECK(sw::detail::default_wait_notice().first == milliseconds(60000));  // then every 5 minutes
  CHECK(sw::detail::default_wait_notice().every == milliseconds(300000));
  ::setenv("SHARDWISE_WAIT_NOTICE", "2.5", 1);
  CHECK(sw::detail::default_wait_notice().first == milliseconds(2500));
  ::setenv("SHARDWISE_WAIT_NOTICE", "0", 1);
  CHECK(!sw::detail::default_wait_notice().on());
  for (char const* bad : {"soon", "-1", "1e10", "5s"}) {
    ::setenv("SHARDWISE_WAIT_NOTICE", bad, 1);
    std::string const expected =
        "SHARDWISE_WAIT_NOTICE=\"" + std::string(bad) + "\" is not a number of seconds; set it to when a long wait";
    CHECK_THROWS_WITH_AS(sw::run_threads(2, [](auto const&) {}), doctest::Contains(expected.c_str()), sw::error);
  }
  ::unsetenv("SHARDWISE_WAIT_NOTICE");
}

TEST_CASE("a rank busy in its own code for less than the grace after a failure is waited for") {
  // Only a rank still running 10 s after the failure is given up (thread_fault.stuck_rank): this one returns,
  // so run_threads rethrows the original exception.
  CHECK_THROWS_WITH_AS(sw::run_threads(2,
                                       [](auto const& world) {
                                         if (world.rank() == 0) throw std::runtime_error("bad shard on rank 0");
                                         std::this_thread::sleep_for(std::chrono::milliseconds(1500));
                                       }),
                       "bad shard on rank 0", std::runtime_error);
}
