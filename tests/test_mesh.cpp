// Meshes: rank layout (row-major, last axis fastest, like torch's DeviceMesh), axis sub-meshes, sizes.
#include <doctest/doctest.h>

#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>

namespace sw = shardwise;

static_assert(sw::device_mesh<sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">>>);
static_assert(sw::device_mesh<sw::Mesh<sw::SerialComm, sw::axis<"tp", 1>>>);
static_assert(!sw::device_mesh<int>);
static_assert(!sw::mesh_members<sw::SerialComm>);  // a communicator is not a mesh
static_assert(sw::communicator<sw::ThreadComm> && sw::communicator<sw::SerialComm>);
static_assert(!sw::communicator<int>);
static_assert(sw::Mesh<sw::SerialComm, sw::axis<"pp">, sw::axis<"dp">, sw::axis<"tp">>::index_of<"tp">() == 2);
static_assert(sw::Mesh<sw::SerialComm, sw::axis<"dp", 2>, sw::axis<"tp">>::static_sizes[0] == 2);

TEST_CASE("a 2-D mesh lays ranks out row-major and splits one communicator per axis") {
  for (int n : {1, 2, 3, 4, 6}) {
    CAPTURE(n);
    sw::run_threads(n, [n](auto& world) {
      int const rows = n % 2 == 0 ? 2 : 1, cols = n / rows;
      auto mesh = sw::make_mesh<"dp", "tp">(world, {rows, cols});
      int const r = world.rank();
      CHECK(mesh.rank() == r);
      CHECK(mesh.size() == n);
      CHECK(mesh.template coordinate<"dp">() == r / cols);
      CHECK(mesh.template coordinate<"tp">() == r % cols);
      CHECK(mesh.template size<"tp">() == cols);
      auto tp = mesh.template axis<"tp">();
      auto dp = mesh.template axis<"dp">();
      static_assert(decltype(tp)::ndim == 1 && decltype(tp)::names[0] == "tp");
      CHECK(tp.size() == cols);
      CHECK(tp.rank() == r % cols);
      CHECK(dp.size() == rows);
      CHECK(dp.rank() == r / cols);
      CHECK(tp.comm(0).label() == "tp");
      // The world ranks in my tp group are my row; in my dp group, my column.
      auto const tp_members = sw::detail::gather_values(tp.comm(0), r);
      for (int q = 0; q < cols; ++q) CHECK(tp_members[static_cast<std::size_t>(q)] == (r / cols) * cols + q);
      auto const dp_members = sw::detail::gather_values(dp.comm(0), r);
      for (int q = 0; q < rows; ++q) CHECK(dp_members[static_cast<std::size_t>(q)] == q * cols + r % cols);
    });
  }
}

TEST_CASE("a 3-D mesh and static axis sizes") {
  sw::run_threads(8, [](auto& world) {
    auto mesh = sw::make_mesh<sw::axis<"pp", 2>, sw::axis<"dp", 2>, sw::axis<"tp", 2>>(world);
    int const r = world.rank();
    CHECK(mesh.coordinates() == std::array<int, 3>{r / 4, (r / 2) % 2, r % 2});
    auto dp = mesh.template axis<"dp">();
    auto const members = sw::detail::gather_values(dp.comm(0), r);
    CHECK(members == std::vector<int>{(r / 4) * 4 + r % 2, (r / 4) * 4 + 2 + r % 2});
  });
}

TEST_CASE("mesh sizes that do not fit the world are errors that say so, on every rank") {
  sw::run_threads(4, [](auto& world) {
    auto three_by_two = [&] { return sw::make_mesh<"dp", "tp">(world, {3, 2}); };
    auto size_zero = [&] { return sw::make_mesh<"tp">(world, {0}); };
    CHECK_THROWS_WITH_AS(three_by_two(),
                         "shardwise::make_mesh: the mesh has 6 ranks (dp=3 x tp=2) but the world has 4; choose axis "
                         "sizes whose product is the world size",
                         sw::error);
    CHECK_THROWS_WITH_AS(size_zero(), doctest::Contains("axis \"tp\" has size 0"), sw::error);
    CHECK_THROWS_WITH_AS((void)(sw::make_mesh<sw::axis<"dp", 2>, sw::axis<"tp", 4>>(world)),
                         doctest::Contains("the mesh has 8 ranks"), sw::error);
    // Products that wrap: (2^30 + 1) x 4 is 4 in 32 bits, and three sizes near 2^31 do not fit in 64 bits.
    CHECK_THROWS_WITH_AS((void)(sw::make_mesh<"dp", "tp">(world, {(1 << 30) + 1, 4})),
                         doctest::Contains("the mesh has 4294967300 ranks"), sw::error);
    int const big = 2'147'483'647;
    CHECK_THROWS_WITH_AS((void)(sw::make_mesh<"pp", "dp", "tp">(world, {big, big, big})),
                         doctest::Contains("the mesh has more than 2^63 ranks"), sw::error);
  });
}

TEST_CASE("the serial mesh is one rank") {
  auto mesh = sw::make_mesh<"dp", "tp">(sw::serial_world(), {1, 1});
  CHECK(mesh.size() == 1);
  CHECK(mesh.template axis<"tp">().size() == 1);
  Eigen::MatrixXf m = Eigen::MatrixXf::Constant(2, 2, 3.0f);
  sw::all_reduce(mesh.template axis<"tp">(), m);
  CHECK(m(1, 1) == 3.0f);
  CHECK_THROWS_WITH_AS(sw::send(mesh.template axis<"tp">(), m, 1), doctest::Contains("serial mesh has one rank"),
                       sw::error);
}
