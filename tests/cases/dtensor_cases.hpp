#pragma once
// Distributed tensors: distribute, distribute_from, from_local, full_tensor and redistribute between every
// pair of layouts, on 1-D and 2-D meshes, checked against shards cut by the reference (test-side torch.chunk),
// and each move's record on a counting mesh against its cost (sw::redistribute_cost).
#include <algorithm>
#include <array>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/adapters/xtensor.hpp>
#include <shardwise/mesh/counting.hpp>
#include <shardwise/shardwise.hpp>
#include <tuple>

#include "support/convert.hpp"
#include "support/transfers.hpp"

namespace cases {

namespace sw = shardwise;

/// A placement as the test understands it, written without the library's own descriptors.
struct expected_placement {
  char kind;  // 'R', 'S', 'P'
  int dim;
  char op;  // for 'P': '+', 'M' (max), 'A' (average)
};
template <class P>
constexpr expected_placement describe_placement() {
  if constexpr (std::is_same_v<P, sw::Replicate>)
    return {'R', 0, 0};
  else if constexpr (std::is_same_v<P, sw::Partial<sw::Sum>>)
    return {'P', 0, '+'};
  else if constexpr (std::is_same_v<P, sw::Partial<sw::Max>>)
    return {'P', 0, 'M'};
  else if constexpr (std::is_same_v<P, sw::Partial<sw::Avg>>)
    return {'P', 0, 'A'};
  else
    return {'S', P::dim, 0};
}
template <class L>
struct layout_description;
template <class... P>
struct layout_description<sw::Layout<P...>> {
  static constexpr std::array<expected_placement, sizeof...(P)> get() { return {describe_placement<P>()...}; }
  static std::string name() {
    std::string text;
    for (auto p : get()) {
      text += text.empty() ? "<" : ", ";
      text += p.kind == 'S'   ? "Shard" + std::to_string(p.dim)
              : p.kind == 'R' ? std::string("R")
                              : std::string("P") + p.op;
    }
    return text + ">";
  }
};

/// What a rank holds of `full` under a layout with no Partial: torch.chunk cuts in mesh-axis order.
template <class Layout, class Mesh>
ref::Array expected_shard(ref::Array shard, Layout const& layout, Mesh const& mesh) {
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (layout[i].kind != 'S') continue;
    int const rank = static_cast<int>(shard.shape.size());
    auto const d = static_cast<std::size_t>(layout[i].dim < 0 ? layout[i].dim + rank : layout[i].dim);
    shard = ref::chunk(shard, d, static_cast<std::size_t>(mesh.size(i)), static_cast<std::size_t>(mesh.coordinate(i)));
  }
  return shard;
}

/// Checks a distributed tensor against the full tensor it represents. A Partial placement is checked through
/// its meaning: reducing the shards over that axis gives the shard of the tensor.
template <class D>
void check_represents(D const& dt, ref::Array const& full, double tol) {
  using T = typename D::tensor_type;
  auto const layout = layout_description<typename D::layout_type>::get();
  auto const& mesh = dt.mesh();
  CHECK(std::vector<std::size_t>(dt.global_shape().dims.begin(),
                                 dt.global_shape().dims.begin() + dt.global_shape().rank) == full.shape);
  T local = dt.to_local();
  auto without_partial = layout;
  for (std::size_t i = 0; i < layout.size(); ++i) {
    if (layout[i].kind != 'P') continue;
    without_partial[i] = {'R', 0, 0};
    auto const& comm = mesh.comm(i);  // reduce over this axis with the library's all_reduce, tested on its own
    auto op = layout[i].op == '+'   ? sw::detail::op_kind::sum
              : layout[i].op == 'M' ? sw::detail::op_kind::max
                                    : sw::detail::op_kind::avg;
    sw::detail::all_reduce_on(comm, local, op);
  }
  CHECK(ref::relative_error(ref::read(local), expected_shard(full, without_partial, mesh)) <= tol);
  CHECK(ref::relative_error(ref::read(dt.full_tensor()), full) <= tol);
}

template <class... L>
struct layouts {};

/// Every layout in From to every layout in To (Shard -> Partial excluded: not a redistribution): the values, and
/// the move's record on the counting mesh under `mesh` against what redistribute_cost says it transfers.
template <class T, class Mesh, class... From, class... To>
void check_redistribute_pairs(Mesh const& mesh, sw::transfer_log& log, ref::Array const& full, layouts<From...>,
                              layouts<To...>) {
  auto one_source = [&]<class F>() {
    auto const source = sw::distribute<F>(mesh, ref::make<T>(full));
    INFO("from " << layout_description<F>::name());
    check_represents(source, full, 0.0);
    auto one_target = [&]<class G>() {
      constexpr bool invalid = [] {
        auto f = layout_description<F>::get();
        auto g = layout_description<G>::get();
        for (std::size_t i = 0; i < f.size(); ++i)
          if (f[i].kind == 'S' && g[i].kind == 'P') return true;
        return false;
      }();
      if constexpr (!invalid) {
        INFO("to " << layout_description<G>::name());
        log.clear();
        auto const moved = source.template redistribute<G>();
        auto const recorded = log.entries();
        auto const predicted = sw::redistribute_cost<G>(source);
        INFO("recorded:\n" << listed(recorded) << "predicted:\n" << predicted);
        CHECK(recorded == predicted);
        check_represents(moved, full, 0.0);
      }
    };
    (one_target.template operator()<To>(), ...);
  };
  (one_source.template operator()<From>(), ...);
}

/// Partial sources built from different contributions per rank (not just "kept on one rank").
template <class T, class Mesh>
void check_partial_sources(Mesh const& mesh, std::vector<std::size_t> const& shape) {
  int const n = mesh.size(0), me = mesh.coordinate(0);
  std::vector<ref::Array> parts;
  for (int q = 0; q < n; ++q) parts.push_back(ref::pattern(shape, 40 + q));
  auto const sum = ref::combine(parts, [](double a, double b) { return a + b; });
  auto const max = ref::combine(parts, [](double a, double b) { return std::max(a, b); });
  auto mine = [&] { return ref::make<T>(parts[static_cast<std::size_t>(me)]); };
  sw::extents global;
  for (auto s : shape) global[global.rank++] = s;

  auto const partial_sum = sw::from_local<sw::Layout<sw::Partial<>>>(mesh, mine(), global);
  check_represents(partial_sum.template redistribute<sw::Layout<sw::Replicate>>(), sum, 1e-6);
  check_represents(partial_sum.template redistribute<sw::Layout<sw::Shard<0>>>(), sum, 1e-6);
  check_represents(partial_sum.template redistribute<sw::Layout<sw::Shard<-1>>>(), sum, 1e-6);
  check_represents(partial_sum.template redistribute<sw::Layout<sw::Partial<sw::Max>>>(), sum, 1e-6);
  auto const partial_max = sw::from_local<sw::Layout<sw::Partial<sw::Max>>>(mesh, mine(), global);
  check_represents(partial_max.template redistribute<sw::Layout<sw::Shard<1>>>(), max, 0.0);
  auto const partial_avg = sw::from_local<sw::Layout<sw::Partial<sw::Avg>>>(mesh, mine(), global);
  auto average = sum;
  for (auto& v : average.values) v /= n;
  check_represents(partial_avg.template redistribute<sw::Layout<sw::Replicate>>(), average, 1e-6);
}

/// `counted`: a counting communicator (sw::counting), whose record each move is checked against.
template <class Counted>
void check_dtensor_1d(Counted const& counted) {
  using sw::Layout, sw::Shard, sw::Replicate, sw::Partial, sw::Max, sw::Avg;
  auto const mesh = sw::make_mesh<"tp">(counted, {counted.size()});
  using all_1d = layouts<Layout<Replicate>, Layout<Shard<0>>, Layout<Shard<1>>, Layout<Shard<-1>>, Layout<Partial<>>,
                         Layout<Partial<Max>>, Layout<Partial<Avg>>>;
  std::vector<std::size_t> const shape{5, 3, 4};  // uneven over 2, 3 and 4 ranks, with empty shards at 4
  auto const full = ref::pattern(shape, 3);
  {
    INFO("Eigen::Tensor<float, 3>, static rank: plans fixed at compile time");
    check_redistribute_pairs<Eigen::Tensor<float, 3>>(mesh, counted.log(), full, all_1d{}, all_1d{});
    check_partial_sources<Eigen::Tensor<float, 3>>(mesh, shape);
  }
  {
    INFO("xt::xarray<double>, rank known at run time: plans made at run time");
    check_redistribute_pairs<xt::xarray<double>>(mesh, counted.log(), full, all_1d{}, all_1d{});
    check_partial_sources<xt::xarray<double>>(mesh, shape);
  }
}

template <class Counted>
void check_dtensor_2d(Counted const& counted) {
  using sw::Layout, sw::Shard, sw::Replicate, sw::Partial;
  int const n = counted.size();
  using P = std::tuple<Replicate, Shard<0>, Shard<1>, Partial<>>;
  using all_2d = decltype([]<std::size_t... I>(std::index_sequence<I...>) {
    return layouts<Layout<std::tuple_element_t<I / 4, P>, std::tuple_element_t<I % 4, P>>...>{};
  }(std::make_index_sequence<16>{}));
  auto const full = ref::pattern({7, 5}, 11);  // two mesh axes may cut one dimension: 7 = 4 + 3 = (2 + 2) + (2 + 1)
  auto check_grid = [&](int rows) {
    INFO("mesh " << rows << " x " << n / rows);
    auto const mesh = sw::make_mesh<"dp", "tp">(counted, {rows, n / rows});
    check_redistribute_pairs<Eigen::MatrixXf>(mesh, counted.log(), full, all_2d{}, all_2d{});
    check_redistribute_pairs<xt::xtensor<double, 2>>(mesh, counted.log(), full, all_2d{}, all_2d{});
  };
  for (int rows = 1; rows <= n; ++rows)
    if (n % rows == 0) check_grid(rows);
}

/// distribute_from (one rank holds the tensor), from_local with and without the global shape, bad shards.
template <class World>
void check_dtensor_construction(World const& world) {
  using sw::Layout, sw::Shard, sw::Replicate, sw::Partial;
  int const n = world.size();
  int const rows = n % 2 == 0 ? 2 : 1;
  auto const mesh = sw::make_mesh<"dp", "tp">(world, {rows, n / rows});
  auto const full = ref::pattern({9, 6}, 5);
  using Grid = Layout<Shard<0>, Shard<-1>>;
  using T = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  for (int root : {0, n - 1}) {
    INFO("distribute_from root " << root);
    T const held = world.rank() == root ? ref::make<T>(full) : T();
    check_represents(sw::distribute_from<Grid>(mesh, held, root), full, 0.0);
    check_represents(sw::distribute_from<Layout<Partial<>, Shard<1>>>(mesh, held, root), full, 0.0);
  }
  {
    INFO("from_local works out the global shape from uneven shards");
    auto const shard = expected_shard(full, layout_description<Grid>::get(), mesh);
    auto const dt = sw::from_local<Grid>(mesh, ref::make<T>(shard));
    check_represents(dt, full, 0.0);
  }
  {
    INFO("from_local with a wrongly sized shard on one rank fails on every rank");
    auto shard = expected_shard(full, layout_description<Grid>::get(), mesh);
    if (world.rank() == 0) shard = ref::pattern({shard.shape[0] + 1, shard.shape[1]}, 1);
    sw::extents const global{9, 6};
    CHECK_THROWS_WITH_AS((void)sw::from_local<Grid>(mesh, ref::make<T>(shard), global), doctest::Contains("from_local"),
                         sw::error);
  }
  {
    INFO("a Shard dimension out of range for a tensor whose rank is known only at run time");
    xt::xarray<double> const x = ref::make<xt::xarray<double>>(full);
    auto const line = sw::make_mesh<"tp">(world, {n});
    CHECK_THROWS_WITH_AS((void)sw::distribute<Layout<Shard<2>>>(line, x), doctest::Contains("Shard<2>"), sw::error);
  }
}

template <class World>
void check_all_dtensor(World const& world) {
  auto const counted = sw::counting(world);  // one communicator type for every case: compiled once
  check_dtensor_1d(counted);
  check_dtensor_2d(counted);
  check_dtensor_construction(counted);
}

}  // namespace cases
