#pragma once
// The collective fault matrix, written once for any world (threads, MPI): ranks that make different calls —
// kinds, element types, roots, reductions, shapes, dimensions — all raise the same error, which names what
// each rank called, and the axis stays usable afterwards (the next matched call gives the right values).
#include <doctest/doctest.h>

#include <Eigen/Dense>
#include <chrono>
#include <functional>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <thread>
#include <vector>

namespace cases {

namespace sw = shardwise;

/// Runs call(mesh, rank) on every rank; each must throw a shardwise::error containing every `expected` part,
/// with the same text on every rank.
template <class World, class Call>
void expect_error_everywhere(World const& world, char const* what, Call&& call,
                             std::vector<std::string> const& expected) {
  CAPTURE(what);
  auto const mesh = sw::make_mesh<"tp">(world, {world.size()});
  std::string message = "(no error)";
  try {
    call(mesh, world.rank());
  } catch (sw::error const& e) {
    message = e.what();
  }
  CAPTURE(message);
  for (auto const& part : expected) CHECK_MESSAGE(message.find(part) != std::string::npos, part);
  auto const text_hash = static_cast<double>(std::hash<std::string>{}(message) >> 12);  // exact in a double
  CHECK(sw::all_reduce(mesh, text_hash, sw::Max{}) == sw::all_reduce(mesh, text_hash, sw::Min{}));
  Eigen::VectorXd one = Eigen::VectorXd::Constant(3, world.rank() + 1.0);
  sw::all_reduce(mesh, one);  // the axis still works after the error
  double const expected_sum = world.size() * (world.size() + 1) / 2.0;
  CHECK(one == Eigen::VectorXd::Constant(3, expected_sum));
}

template <class World>
void check_mismatched_calls(World const& world) {
  std::string const first = "rank 0 called ", second = "rank 1 called ";
  auto const header = "ranks called different collectives on mesh axis \"tp\"";
  auto const vector = [](int n) { return Eigen::VectorXf::Ones(n).eval(); };

  expect_error_everywhere(world, "kinds",
                          [&](auto const& mesh, int rank) {
                            Eigen::VectorXf v = vector(4), out;
                            if (rank == 0)
                              sw::all_gather(mesh, v, out, 0);
                            else
                              sw::all_reduce(mesh, v);
                          },
                          {header, first + "all_gather<float>([4], dim 0)", second + "all_reduce<float>([4], sum)"});

  expect_error_everywhere(
      world, "kinds, large data (MPI sends it beside the record on two ranks)",
      [&](auto const& mesh, int rank) {
        Eigen::VectorXf v = vector(1 << 20), out;
        if (rank == 0)
          sw::all_gather(mesh, v, out, 0);
        else
          sw::all_reduce(mesh, v);
      },
      {header, first + "all_gather<float>([1048576], dim 0)", second + "all_reduce<float>([1048576], sum)"});

  for (int const n : {4, 1 << 20}) {  // large: MPI's blocking all_gather on two ranks sends data with its record
    expect_error_everywhere(world, "all_gather_start against all_gather",
                            [&](auto const& mesh, int rank) {
                              Eigen::VectorXf v = vector(n), out;
                              if (rank == 0)
                                sw::all_gather_start(mesh, v, out, 0).wait();
                              else
                                sw::all_gather(mesh, v, out, 0);
                            },
                            {header, first + "all_gather_start<float>([" + std::to_string(n) + "], dim 0)",
                             second + "all_gather<float>([" + std::to_string(n) + "], dim 0)"});
  }

  expect_error_everywhere(world, "element types",
                          [&](auto const& mesh, int rank) {
                            if (rank == 0) {
                              Eigen::VectorXd v = Eigen::VectorXd::Ones(4);
                              sw::all_reduce(mesh, v);
                            } else {
                              Eigen::VectorXf v = vector(4);
                              sw::all_reduce(mesh, v);
                            }
                          },
                          {header, first + "all_reduce<double>([4], sum)", second + "all_reduce<float>([4], sum)"});

  expect_error_everywhere(world, "roots",
                          [&](auto const& mesh, int rank) {
                            Eigen::VectorXf v = vector(4);
                            sw::broadcast(mesh, v, rank == 0 ? 0 : 1);
                          },
                          {header, first + "broadcast<float>([4], root 0)", second + "broadcast<float>([4], root 1)"});

  expect_error_everywhere(world, "reductions",
                          [&](auto const& mesh, int rank) {
                            Eigen::VectorXf v = vector(4);
                            if (rank == 0)
                              sw::all_reduce(mesh, v, sw::Sum{});
                            else
                              sw::all_reduce(mesh, v, sw::Max{});
                          },
                          {header, first + "all_reduce<float>([4], sum)", second + "all_reduce<float>([4], max)"});

  expect_error_everywhere(
      world, "counts",
      [&](auto const& mesh, int rank) {
        Eigen::VectorXf v = vector(rank == 0 ? 4 : 5);
        sw::all_reduce(mesh, v);
      },
      {"all_reduce on mesh axis \"tp\": shapes differ across ranks", "rank 0 has [4]", "rank 1 has [5]"});

  expect_error_everywhere(
      world, "dimensions",
      [&](auto const& mesh, int rank) {
        Eigen::MatrixXf m = Eigen::MatrixXf::Ones(2, 2), out;
        sw::all_gather(mesh, m, out, rank == 0 ? 0 : 1);
      },
      {header, first + "all_gather<float>([2, 2], dim 0)", second + "all_gather<float>([2, 2], dim 1)"});

  expect_error_everywhere(world, "reduce_scatter against all_to_all",
                          [&](auto const& mesh, int rank) {
                            Eigen::MatrixXf m = Eigen::MatrixXf::Ones(4, 4), out;
                            if (rank == 0)
                              sw::reduce_scatter(mesh, m, out, 0);
                            else
                              sw::all_to_all(mesh, m, out, 0, 1);
                          },
                          {header, first + "reduce_scatter<float>([4, 4], dim 0, sum)",
                           second + "all_to_all<float>([4, 4], split dim 0, concat dim 1)"});

  // Each rank's call is named with the file and line it was made at (std::source_location).
  // clang-format off
  auto const gather = [](auto const& mesh, Eigen::VectorXf const& v, Eigen::VectorXf& out) { sw::all_gather(mesh, v, out, 0); };
  std::string const gather_line = std::to_string(__LINE__ - 1);
  auto const reduce = [](auto const& mesh, Eigen::VectorXf& v) { sw::all_reduce(mesh, v); };
  std::string const reduce_line = std::to_string(__LINE__ - 1);
  // clang-format on
  expect_error_everywhere(
      world, "the caller's line",
      [&](auto const& mesh, int rank) {
        Eigen::VectorXf v = vector(4), out;
        if (rank == 0)
          gather(mesh, v, out);
        else
          reduce(mesh, v);
      },
      {first + "all_gather<float>([4], dim 0) at ", "fault_cases.hpp:" + gather_line + " as call #",
       second + "all_reduce<float>([4], sum) at ", "fault_cases.hpp:" + reduce_line + " as call #"});
}

/// The error `scenario(world)` raises on this rank (it must raise one), checked: every `expected` part, the
/// same text on every rank, and raised well before the default timeout of 30 minutes (within 120 s: a loaded
/// machine took up to 51 s; what is checked is that the desync check ended it, and that nothing stays waiting).
template <class World, class Scenario>
void expect_desync(World const& world, char const* what, Scenario&& scenario,
                   std::vector<std::string> const& expected) {
  CAPTURE(what);
  REQUIRE(world.timeout() == std::chrono::minutes(30));  // the default: only the desync check can end the wait
  auto const start = std::chrono::steady_clock::now();
  std::string message = "(no error)";
  try {
    scenario(world);
  } catch (sw::error const& e) {
    message = e.what();
  }
  double const seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(message);
  CHECK(seconds < 120.0);
  CHECK(message.find("shardwise: the ranks wait for each other in calls that can never complete") == 0);
  for (auto const& part : expected) CHECK_MESSAGE(message.find(part) != std::string::npos, part);
  auto const checked = sw::make_mesh<"checked">(world, {world.size()});
  auto const text_hash = static_cast<double>(std::hash<std::string>{}(message) >> 12);  // exact in a double
  CHECK(sw::all_reduce(checked, text_hash, sw::Max{}) == sw::all_reduce(checked, text_hash, sw::Min{}));
}

/// The crossing of check_desyncs_found, with `hold(world)` called on every rank just before its first call (it
/// sets a test hold of mesh/desync.hpp that holds the rank back, as a loaded machine would): every rank must
/// still raise the same message, in time, and take part in the next collective.
template <class World, class Hold>
void check_crossing_with_held_ranks(World const& world, char const* what, Hold&& hold) {
  Eigen::VectorXf v = Eigen::VectorXf::Ones(4);
  int const n = world.size();
  std::string others;  // "1, 2, 3": the world ranks rank 0 waits for
  for (int r = 1; r < n; ++r) others += (r > 1 ? ", " : "") + std::to_string(r);
  expect_desync(
      world, what,
      [&](World const& w) {
        auto const a = sw::make_mesh<"a">(w, {w.size()});
        auto const b = sw::make_mesh<"b">(w, {w.size()});
        hold(w);
        if (w.rank() == 0) {
          sw::all_reduce(a, v);
          sw::all_reduce(b, v);
        } else {
          sw::all_reduce(b, v);
          sw::all_reduce(a, v);
        }
      },
      {"world rank 0 waits in all_reduce<float>([4], sum) at ",
       " as call #0 on mesh axis \"a\"" + std::string(n > 2 ? " for world ranks " : " for world rank ") + others,
       "world rank " + std::to_string(n - 1) + " waits in all_reduce<float>([4], sum) at ",
       " as call #0 on mesh axis \"b\" for world rank 0"});
  sw::detail::desync_test_holds_of(world) = {};
}

/// Desyncs that only the timeout used to end, each found in seconds with the default timeout, and named with
/// every rank's call; a peer that is only slow is not reported.
template <class World>
void check_desyncs_found(World const& world) {
  Eigen::VectorXf v = Eigen::VectorXf::Ones(4);
  // clang-format off
  auto const reduce_first = [&](auto const& mesh) { sw::all_reduce(mesh, v); };
  std::string const first_line = "fault_cases.hpp:" + std::to_string(__LINE__ - 1);
  auto const reduce_then = [&](auto const& mesh) { sw::all_reduce(mesh, v); };
  std::string const then_line = "fault_cases.hpp:" + std::to_string(__LINE__ - 1);
  auto const meet = [&](auto const& mesh) { sw::all_reduce(mesh, v); };
  std::string const meet_line = "fault_cases.hpp:" + std::to_string(__LINE__ - 1);
  // clang-format on
  int const n = world.size();
  std::string others;  // "1, 2, 3": the world ranks rank 0 waits for
  for (int r = 1; r < n; ++r) others += (r > 1 ? ", " : "") + std::to_string(r);
  std::string const waits_for_others = (n > 2 ? " for world ranks " : " for world rank ") + others;

  // Rank 0 calls on "a" then "b"; the others on "b" then "a": each waits for the other forever.
  expect_desync(world, "crossing",
                [&](World const& w) {
                  auto const a = sw::make_mesh<"a">(w, {w.size()});
                  auto const b = sw::make_mesh<"b">(w, {w.size()});
                  if (w.rank() == 0) {
                    reduce_first(a);
                    reduce_then(b);
                  } else {
                    reduce_first(b);
                    reduce_then(a);
                  }
                },
                {"world rank 0 waits in all_reduce<float>([4], sum) at ",
                 first_line + " as call #0 on mesh axis \"a\"" + waits_for_others,
                 "world rank " + std::to_string(n - 1) + " waits in all_reduce<float>([4], sum) at ",
                 first_line + " as call #0 on mesh axis \"b\" for world rank 0", "in the same order"});

  // Rank 0 reduces once more than its peers on "tp"; then every rank meets on "all". (Not on the world: an axis
  // whose ranks fell out of step stays so, and the world must check the messages afterwards.)
  expect_desync(world, "one call more",
                [&](World const& w) {
                  auto const tp = sw::make_mesh<"tp">(w, {w.size()});
                  auto const all = sw::make_mesh<"all">(w, {w.size()});
                  reduce_first(tp);
                  if (w.rank() == 0) reduce_then(tp);
                  meet(all);
                },
                {"world rank 0 waits in all_reduce<float>([4], sum) at ",
                 then_line + " as call #1 on mesh axis \"tp\"" + waits_for_others,
                 "world rank 1 waits in all_reduce<float>([4], sum) at ",
                 meet_line + " as call #0 on mesh axis \"all\" for world rank 0"});

  // A peer that computes for longer than the check's first look (2 s), then comes: no error.
  auto const tp = sw::make_mesh<"tp">(world, {n});
  Eigen::VectorXf ones = Eigen::VectorXf::Ones(4);
  if (world.rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(3500));
  CHECK_NOTHROW(sw::all_reduce(tp, ones));
  CHECK(ones == Eigen::VectorXf::Constant(4, static_cast<float>(n)));
}

}  // namespace cases
