// The collective fault matrix on the serial-free meshes: threads at 2, 3 and 4 ranks (test_mpi_faults.cpp
// runs the same cases under mpiexec).
#include <doctest/doctest.h>

#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <utility>

#include "cases/fault_cases.hpp"

TEST_CASE("mismatched collective calls raise the same error on every rank, thread mesh") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto const& world) { cases::check_mismatched_calls(world); });
  }
}

namespace {

namespace sw = shardwise;
using namespace std::chrono_literals;

/// Runs fn on n thread ranks and returns the error run_threads rethrows and the seconds it took.
template <class Fn>
std::pair<std::string, double> failure_of(int n, Fn&& fn) {
  auto const start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    sw::run_threads(n, fn);
  } catch (sw::error const& e) {
    message = e.what();
  }
  return {message, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count()};
}

}  // namespace

TEST_CASE("desyncs are found in seconds with the default timeout, naming every rank's call, thread mesh") {
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto const& world) { cases::check_desyncs_found(world); });
  }
}

TEST_CASE("a desync's verdict taken late is not mistaken for a new one, thread mesh") {
  // The last rank takes its verdict 6 s late: the others raise it, and the check in their next collective
  // (2 s later) must not take its old wait for a new cycle; it raises the same message and joins them.
  for (int n = 2; n <= 4; ++n) {
    CAPTURE(n);
    shardwise::run_threads(n, [](auto const& world) {
      cases::check_crossing_with_held_ranks(world, "a verdict taken late", [&](auto const& w) {
        if (w.rank() == w.size() - 1)
          sw::detail::desync_test_holds_of(w).verdicts_until = std::chrono::steady_clock::now() + 6s;
      });
    });
  }
}

TEST_CASE("a rank that waits past the timeout raises, naming the rank that did not arrive") {
  auto const [message, seconds] = failure_of(2, [](auto const& world) {
    auto const mesh = sw::make_mesh<"tp">(world, {2});
    mesh.set_timeout(300ms);
    Eigen::VectorXf v = Eigen::VectorXf::Ones(4);
    sw::all_reduce(mesh, v);  // both arrive: call 0 works
    if (world.rank() == 1) std::this_thread::sleep_for(1500ms);
    sw::all_reduce(mesh, v);
  });
  std::string const& error_text = message;  // not the binding: doctest's CAPTURE is a lambda (clang 14)
  CAPTURE(error_text);
  CHECK(message.find("rank 0 of mesh axis \"tp\" waited 0.3 s in all_reduce for its peers: rank 1 is not in a "
                     "collective of this axis; it has made 1 calls on it") != std::string::npos);
  CHECK(message.find("SHARDWISE_TIMEOUT") != std::string::npos);
  CHECK(seconds < 0.3 + 1.5 + 2.0);  // rank 1 finishes its sleep, then finds its peer gone
}

TEST_CASE("with a short timeout, a crossing is still named as a deadlock, before the timeout") {
  auto const [message, seconds] = failure_of(2, [](auto const& world) {
    auto const a = sw::make_mesh<"a">(world, {2});
    auto const b = sw::make_mesh<"b">(world, {2});
    a.set_timeout(300ms);
    b.set_timeout(300ms);
    Eigen::VectorXf v = Eigen::VectorXf::Ones(4);
    if (world.rank() == 0) {
      sw::all_reduce(a, v);
      sw::all_reduce(b, v);
    } else {
      sw::all_reduce(b, v);
      sw::all_reduce(a, v);
    }
  });
  std::string const& error_text = message;  // not the binding: doctest's CAPTURE is a lambda (clang 14)
  CAPTURE(error_text);
  // The desync check looks first at a third of the timeout (0.1 s here), so the deadlock is named, not timed out.
  CHECK(message.find("can never complete") != std::string::npos);
  CHECK(message.find("world rank 0 waits in all_reduce<float>([4], sum) at ") != std::string::npos);
  CHECK(message.find("on mesh axis \"a\" for world rank 1; world rank 1 waits in all_reduce<float>([4], sum) at ") !=
        std::string::npos);
  CHECK(message.find("waited") == std::string::npos);  // not the timeout's message
  CHECK(seconds < 0.3 + 2.0);                          // the meshes' setup included (0.30 s under ThreadSanitizer)
}

TEST_CASE("a recv with no matching send times out") {
  auto const [message, seconds] = failure_of(2, [](auto const& world) {
    auto const mesh = sw::make_mesh<"tp">(world, {2});
    mesh.set_timeout(300ms);
    Eigen::VectorXf v;
    if (world.rank() == 0) sw::recv(mesh, v, 1, 7);
    std::this_thread::sleep_for(1000ms);  // rank 1 stays, so only the timeout can end rank 0's wait
  });
  std::string const& error_text = message;  // not the binding: doctest's CAPTURE is a lambda (clang 14)
  CAPTURE(error_text);
  CHECK(message.find("recv on mesh axis \"tp\": rank 0 waited 0.3 s for a message from rank 1 (tag 7)") !=
        std::string::npos);
  CHECK(seconds < 0.3 + 1.0 + 2.0);
}

TEST_CASE("SHARDWISE_TIMEOUT sets the default timeout; a bad value is refused by name") {
  ::setenv("SHARDWISE_TIMEOUT", "0.25", 1);
  sw::run_threads(2, [](auto const& world) { CHECK(world.timeout() == 250ms); });
  ::setenv("SHARDWISE_TIMEOUT", "ten", 1);
  CHECK_THROWS_WITH_AS(sw::run_threads(2, [](auto const&) {}),
                       doctest::Contains("SHARDWISE_TIMEOUT=\"ten\" is not a number of seconds"), sw::error);
  ::unsetenv("SHARDWISE_TIMEOUT");
  sw::run_threads(1, [](auto const& world) { CHECK(world.timeout() == std::chrono::minutes(30)); });
}
