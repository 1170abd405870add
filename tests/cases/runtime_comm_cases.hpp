#pragma once
// sw::RuntimeComm, what sw::launch passes: every case of the backend it wraps passes through it unchanged, and a
// counting wrapper records through it what it records on the backend itself. test_runtime_comm.cpp runs them over
// threads, test_mpi_runtime_comm.cpp over MPI.
#include <doctest/doctest.h>

#include <Eigen/Core>
#include <shardwise/mesh/counting.hpp>
#include <shardwise/mesh/runtime.hpp>
#include <shardwise/shardwise.hpp>
#include <type_traits>

#include "cases/collective_cases.hpp"
#include "cases/fault_cases.hpp"
#include "cases/pipeline_cases.hpp"

namespace runtime_comm_cases {

namespace sw = shardwise;

/// The same few collectives, point-to-point transfers and a started gather, on a 2-D mesh over `world`.
template <class World>
void some_traffic(World const& world) {
  int const n = world.size(), rows = n % 2 == 0 ? 2 : 1;
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {rows, n / rows});
  auto const tp = sw::submesh<"tp">(mesh);
  Eigen::MatrixXf m = Eigen::MatrixXf::Constant(4, 6, float(world.rank() + 1)), gathered, scattered;
  sw::all_reduce(tp, m);
  sw::all_gather(sw::submesh<"dp">(mesh), m, gathered, 0);
  Eigen::MatrixXf const wide = Eigen::MatrixXf::Ones(2 * tp.size(), 3);
  sw::reduce_scatter(tp, wide, scattered, 0);
  auto pending = sw::all_gather_start(tp, m, gathered, 1);
  pending.wait();
  sw::barrier(mesh);
}

/// Runs the cases on `backend` (a ThreadComm or an MpiComm) wrapped in a RuntimeComm.
template <class Backend>
void check_all(Backend const& backend) {
  sw::RuntimeComm const world(backend);
  CHECK(world.on_mpi() == std::is_same_v<Backend, sw::MpiComm>);
  CHECK(world.rank() == backend.rank());
  CHECK(world.size() == backend.size());
  CHECK(world.label() == backend.label());
  world.visit([&]<class B>(B const& inner) {
    CHECK(std::is_same_v<B, Backend>);
    CHECK(inner.rank() == backend.rank());
  });

  // In sequence on every rank (no SUBCASE: ranks may be threads of one doctest run).
  cases::check_all_collectives<cases::eigen_types>(world);     // the collective and point-to-point cases
  if (world.size() > 1) cases::check_mismatched_calls(world);  // the backend's errors, on every rank
  {
    INFO("the pipeline schedules equal the unsharded run (buffered sends where the backend has them)");
    auto const pp = sw::make_mesh<"pp">(world, {world.size()});
    pipeline_cases::check_all(pp);
  }
  {
    INFO("a counting wrapper records the same calls as around the backend");
    auto const counted_backend = sw::counting(backend);
    auto const counted_runtime = sw::counting(world);
    some_traffic(counted_backend);
    some_traffic(counted_runtime);
    auto const expected = counted_backend.log().entries(), recorded = counted_runtime.log().entries();
    CHECK(expected.size() >= 5);
    CHECK(recorded == expected);
  }
}

}  // namespace runtime_comm_cases
