#pragma once
// Every collective on every tensor type, along every dimension, with uneven pieces, checked against the
// reference computed from all ranks' inputs. Written once for any world (threads, MPI) and any 1-D mesh.
#include <algorithm>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/adapters/xtensor.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <vector>

#include "support/convert.hpp"

namespace cases {

namespace sw = shardwise;

template <class T>
double tolerance() {
  using S = sw::element_t<T>;
  if constexpr (std::is_same_v<S, double>)
    return 1e-12;
  else if constexpr (std::is_same_v<S, float>)
    return 1e-6;
  else
    return 1e-2;  // bfloat16: 8 significant bits
}

template <class T>
bool small_values() {
  return !std::is_arithmetic_v<sw::element_t<T>>;  // bfloat16 holds small integers exactly
}

template <class T>
std::vector<std::size_t> base_shape() {
  std::size_t const rank = sw::rank_v<T> == sw::dynamic_rank ? 3 : sw::rank_v<T>;
  std::vector<std::size_t> shape{5, 3, 4};
  shape.resize(rank);
  return shape;
}

#define CASES_CHECK_CLOSE(got, expected, tol)                                                       \
  do {                                                                                              \
    auto const got_ = (got);                                                                        \
    auto const expected_ = (expected);                                                              \
    INFO("shape " << ref::describe(got_.shape) << ", expected " << ref::describe(expected_.shape)); \
    CHECK(ref::relative_error(got_, expected_) <= (tol));                                           \
  } while (0)

/// "[5, 3, 4]": a shape as the library's errors print it.
inline std::string bracketed(std::vector<std::size_t> const& shape) {
  std::string out = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

/// "rank 0 has [6, 3], rank 1 has [5, 3]": every rank's shape, as a shape-mismatch error lists them.
template <class ShapeOf>
std::string every_rank(int ranks, ShapeOf&& shape_of_rank) {
  std::string out;
  for (int q = 0; q < ranks; ++q)
    out += (q ? ", rank " : "rank ") + std::to_string(q) + " has " + bracketed(shape_of_rank(q));
  return out;
}

/// "shardwise::all_gather on mesh axis \"tp\"": how every collective's error begins.
inline std::string site(char const* collective, std::string const& axis_name) {
  return std::string("shardwise::") + collective + " on mesh axis \"" + axis_name + "\"";
}

/// Runs every collective over the 1-D mesh `axis`, named `axis_name`. `seed` makes this group's inputs differ from
/// other groups'.
template <class T, class AxisMesh>
void check_collectives(AxisMesh const& axis, std::string const& axis_name, int seed) {
  int const n = axis.size(0);
  int const me = axis.coordinate(0);
  auto const un = static_cast<std::size_t>(n), ume = static_cast<std::size_t>(me);
  auto const shape = base_shape<T>();
  std::size_t const rank = shape.size();
  double const tol = tolerance<T>();
  bool const small = small_values<T>();
  auto input_of = [&](int q, std::vector<std::size_t> s) { return ref::pattern(std::move(s), seed + q, small); };
  INFO("ranks " << n << ", rank " << me << ", seed " << seed);

  {  // not a SUBCASE: doctest re-enters subcases, which ranks on threads cannot share
    INFO("all_reduce");
    std::vector<ref::Array> all;
    for (int q = 0; q < n; ++q) all.push_back(input_of(q, shape));
    auto run = [&](auto op, auto&& combine) {
      T t = ref::make<T>(all[ume]);
      sw::all_reduce(axis, t, op);
      CASES_CHECK_CLOSE(ref::read(t), ref::combine(all, combine), tol);
    };
    run(sw::Sum{}, [](double a, double b) { return a + b; });
    run(sw::Max{}, [](double a, double b) { return std::max(a, b); });
    run(sw::Min{}, [](double a, double b) { return std::min(a, b); });
    T t = ref::make<T>(all[ume]);
    sw::all_reduce(axis, t, sw::Avg{});
    auto average = ref::combine(all, [](double a, double b) { return a + b; });
    for (auto& v : average.values) v /= n;
    CASES_CHECK_CLOSE(ref::read(t), average, tol);
  }

  {
    INFO("all_gather along every dimension, uneven pieces");
    for (std::size_t d = 0; d < rank; ++d) {
      std::vector<ref::Array> parts;
      for (int q = 0; q < n; ++q) {
        auto s = shape;
        s[d] = static_cast<std::size_t>((q * 2 + 1) % 4);  // 1, 3, 1, 3 ... and never all equal
        parts.push_back(input_of(q, s));
      }
      T const in = ref::make<T>(parts[ume]);
      T out;
      int const dim = d == rank - 1 ? -1 : static_cast<int>(d);  // also the negative spelling
      sw::all_gather(axis, in, out, dim);
      INFO("dim " << dim);
      CASES_CHECK_CLOSE(ref::read(out), ref::concat(parts, d), 0.0);
    }
  }

  {
    INFO("all_gather_start along every dimension, two in flight at once, finished in reverse order");
    for (std::size_t d = 0; d < rank; ++d) {
      std::vector<ref::Array> first, second;
      for (int q = 0; q < n; ++q) {
        auto s = shape;
        s[d] = static_cast<std::size_t>((q * 2 + 1) % 4);
        first.push_back(input_of(q, s));
        second.push_back(input_of(q + n, shape));
      }
      T const in_first = ref::make<T>(first[ume]), in_second = ref::make<T>(second[ume]);
      T out_first, out_second;
      INFO("dim " << d);
      auto pending_first = sw::all_gather_start(axis, in_first, out_first, static_cast<int>(d));
      auto pending_second = sw::all_gather_start(axis, in_second, out_second, static_cast<int>(d));
      pending_second.wait();
      pending_first.wait();
      CHECK_FALSE(pending_first.pending());
      CASES_CHECK_CLOSE(ref::read(out_first), ref::concat(first, d), 0.0);
      CASES_CHECK_CLOSE(ref::read(out_second), ref::concat(second, d), 0.0);
    }
  }

  {
    INFO("reduce_scatter along every dimension, torch.chunk pieces");
    std::vector<ref::Array> all;
    for (int q = 0; q < n; ++q) all.push_back(input_of(q, shape));
    auto const sum = ref::combine(all, [](double a, double b) { return a + b; });
    auto const max = ref::combine(all, [](double a, double b) { return std::max(a, b); });
    for (std::size_t d = 0; d < rank; ++d) {
      INFO("dim " << d);
      T const in = ref::make<T>(all[ume]);
      T out;
      sw::reduce_scatter(axis, in, out, static_cast<int>(d));
      CASES_CHECK_CLOSE(ref::read(out), ref::chunk(sum, d, un, ume), tol);
      sw::reduce_scatter(axis, in, out, static_cast<int>(d) - static_cast<int>(rank), sw::Max{});
      CASES_CHECK_CLOSE(ref::read(out), ref::chunk(max, d, un, ume), 0.0);
    }
  }

  {
    INFO("broadcast from the last rank");
    int const root = n - 1;
    auto const expected = input_of(root, shape);
    auto empty_shape = shape;
    empty_shape[0] = 0;
    T t = ref::make<T>(me == root ? expected : ref::Array::zeros(empty_shape));
    sw::broadcast(axis, t, root);
    CASES_CHECK_CLOSE(ref::read(t), expected, 0.0);
  }

  {
    INFO("all_to_all for every pair of dimensions");
    for (std::size_t split = 0; split < rank; ++split)
      for (std::size_t concat = 0; concat < rank; ++concat) {
        if (split == concat) continue;
        INFO("split " << split << ", concat " << concat);
        std::vector<ref::Array> inputs;
        for (int q = 0; q < n; ++q) {
          auto s = shape;
          s[concat] = static_cast<std::size_t>(q % 2 + 1);
          inputs.push_back(input_of(q, s));
        }
        std::vector<ref::Array> received;
        for (int q = 0; q < n; ++q) received.push_back(ref::chunk(inputs[static_cast<std::size_t>(q)], split, un, ume));
        T const in = ref::make<T>(inputs[ume]);
        T out;
        sw::all_to_all(axis, in, out, static_cast<int>(split), static_cast<int>(concat));
        CASES_CHECK_CLOSE(ref::read(out), ref::concat(received, concat), 0.0);
      }
  }

  {
    INFO("send and recv around a ring");
    if (n > 1) {
      int const next = (me + 1) % n, previous = (me + n - 1) % n;
      T const mine = ref::make<T>(input_of(me, shape));
      T got;
      if (me % 2 == 0) {
        sw::send(axis, mine, next, 7);
        sw::recv(axis, got, previous, 7);
      } else {
        sw::recv(axis, got, previous, 7);
        sw::send(axis, mine, next, 7);
      }
      CASES_CHECK_CLOSE(ref::read(got), input_of(previous, shape), 0.0);
    }
    sw::barrier(axis);
  }

  {
    INFO("bad input: every rank raises the same error, naming the collective, the axis and every rank's sizes");
    // The library's messages spelled out here, not taken from the library.
    auto same_shape_error = [&](char const* collective, std::string const& sizes) {
      return site(collective, axis_name) + ": shapes differ across ranks: " + sizes +
             "; every rank must pass a tensor of the same shape";
    };
    auto outside_error = [&](char const* collective, std::size_t dim, std::string const& sizes) {
      std::string const d = std::to_string(dim);
      return site(collective, axis_name) + ": shapes differ across ranks outside dimension " + d + ": " + sizes +
             "; every rank must pass tensors that differ only along dimension " + d;
    };
    if (n > 1) {
      INFO("rank 0 is one longer along dimension 0");
      auto shape_at = [&](int q) {
        auto s = shape;
        if (q == 0) s[0] += 1;
        return s;
      };
      std::string const sizes = every_rank(n, shape_at);
      T const in = ref::make<T>(input_of(me, shape_at(me)));
      T t = in, out;
      CHECK_THROWS_WITH_AS(sw::all_reduce(axis, t), same_shape_error("all_reduce", sizes).c_str(), sw::error);
      CHECK_THROWS_WITH_AS(sw::reduce_scatter(axis, in, out, -1), same_shape_error("reduce_scatter", sizes).c_str(),
                           sw::error);
      if (rank > 1) {
        CHECK_THROWS_WITH_AS(sw::all_gather(axis, in, out, -1), outside_error("all_gather", rank - 1, sizes).c_str(),
                             sw::error);
        CHECK_THROWS_WITH_AS(sw::all_to_all(axis, in, out, 0, -1), outside_error("all_to_all", rank - 1, sizes).c_str(),
                             sw::error);
      }
    }
    if (n > 1 && rank > 1) {
      INFO("the last rank is one shorter along the last dimension");
      auto shape_at = [&](int q) {
        auto s = shape;
        if (q == n - 1) s.back() -= 1;
        return s;
      };
      std::string const sizes = every_rank(n, shape_at);
      T const in = ref::make<T>(input_of(me, shape_at(me)));
      T t = in, out;
      CHECK_THROWS_WITH_AS(sw::all_reduce(axis, t, sw::Max{}), same_shape_error("all_reduce", sizes).c_str(),
                           sw::error);
      CHECK_THROWS_WITH_AS(sw::reduce_scatter(axis, in, out, 0), same_shape_error("reduce_scatter", sizes).c_str(),
                           sw::error);
      CHECK_THROWS_WITH_AS(sw::all_gather(axis, in, out, 0), outside_error("all_gather", 0, sizes).c_str(), sw::error);
      CHECK_THROWS_WITH_AS(sw::all_to_all(axis, in, out, -1, 0), outside_error("all_to_all", 0, sizes).c_str(),
                           sw::error);
    }
    if constexpr (sw::rank_v<T> == sw::dynamic_rank) {
      if (n > 1) {
        INFO("the last rank passes a tensor of one dimension fewer");
        auto shape_at = [&](int q) {
          auto s = shape;
          if (q == n - 1) s.pop_back();
          return s;
        };
        std::string const sizes = every_rank(n, shape_at);
        T const in = ref::make<T>(input_of(me, shape_at(me)));
        T t = in, out;
        CHECK_THROWS_WITH_AS(sw::all_reduce(axis, t), same_shape_error("all_reduce", sizes).c_str(), sw::error);
        CHECK_THROWS_WITH_AS(sw::reduce_scatter(axis, in, out, 0), same_shape_error("reduce_scatter", sizes).c_str(),
                             sw::error);
        CHECK_THROWS_WITH_AS(sw::all_gather(axis, in, out, 0), outside_error("all_gather", 0, sizes).c_str(),
                             sw::error);
        CHECK_THROWS_WITH_AS(sw::all_to_all(axis, in, out, 1, 0), outside_error("all_to_all", 0, sizes).c_str(),
                             sw::error);
      }
    }
    {
      INFO("a dimension that does not exist, the first one past either end");
      int const r = static_cast<int>(rank);
      auto no_such_dim = [&](char const* collective, int dim) {
        return site(collective, axis_name) + ": dimension " + std::to_string(dim) +
               " does not exist in a tensor of rank " + std::to_string(r) + "; use a dimension in [" +
               std::to_string(-r) + ", " + std::to_string(r - 1) + "]";
      };
      T const in = ref::make<T>(input_of(me, shape));
      T out;
      CHECK_THROWS_WITH_AS(sw::all_gather(axis, in, out, r), no_such_dim("all_gather", r).c_str(), sw::error);
      CHECK_THROWS_WITH_AS(sw::all_gather(axis, in, out, -r - 1), no_such_dim("all_gather", -r - 1).c_str(), sw::error);
      CHECK_THROWS_WITH_AS(sw::reduce_scatter(axis, in, out, r), no_such_dim("reduce_scatter", r).c_str(), sw::error);
      CHECK_THROWS_WITH_AS(sw::reduce_scatter(axis, in, out, -r - 1), no_such_dim("reduce_scatter", -r - 1).c_str(),
                           sw::error);
      CHECK_THROWS_WITH_AS(sw::all_to_all(axis, in, out, r, 0), no_such_dim("all_to_all", r).c_str(), sw::error);
      CHECK_THROWS_WITH_AS(sw::all_to_all(axis, in, out, 0, -r - 1), no_such_dim("all_to_all", -r - 1).c_str(),
                           sw::error);
      T t = in;
      CHECK_THROWS_WITH_AS(sw::broadcast(axis, t, n),
                           (site("broadcast", axis_name) + ": root rank " + std::to_string(n) +
                            " does not exist; the axis has ranks 0 to " + std::to_string(n - 1))
                               .c_str(),
                           sw::error);
    }
  }
}

/// The tensor types every collective is checked on, one list per library (two files compile in parallel).
template <class Fn>
void for_each_eigen_type(Fn&& fn) {
  fn.template operator()<Eigen::MatrixXf>("Eigen::MatrixXf (column-major)");
  fn.template operator()<Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>(
      "Eigen::Matrix<double, row-major>");
  fn.template operator()<Eigen::VectorXd>("Eigen::VectorXd");
  fn.template operator()<Eigen::Matrix<Eigen::bfloat16, Eigen::Dynamic, Eigen::Dynamic>>("Eigen bfloat16 matrix");
  fn.template operator()<Eigen::Tensor<float, 3>>("Eigen::Tensor<float, 3> (column-major)");
  fn.template operator()<Eigen::Tensor<double, 3, Eigen::RowMajor>>("Eigen::Tensor<double, 3, RowMajor>");
}

template <class Fn>
void for_each_xtensor_type(Fn&& fn) {
  fn.template operator()<xt::xtensor<float, 3>>("xt::xtensor<float, 3>");
  fn.template operator()<xt::xtensor<double, 2, xt::layout_type::column_major>>("xt::xtensor<double, 2, column-major>");
  fn.template operator()<xt::xarray<double>>("xt::xarray<double>");
}

struct eigen_types {
  template <class Fn>
  static void each(Fn&& fn) {
    for_each_eigen_type(fn);
  }
};
struct xtensor_types {
  template <class Fn>
  static void each(Fn&& fn) {
    for_each_xtensor_type(fn);
  }
};

/// recv into a tensor of another element type or rank: an error with the sizes, and no message left pending —
/// the next send and recv between the same ranks with the same tag deliver the right tensor.
template <class AxisMesh>
void check_recv_mismatch(AxisMesh const& axis) {
  int const n = axis.size(), me = axis.rank();
  if (n < 2 || me > 1) return;
  int const peer = 1 - me;
  Eigen::VectorXd const sent = Eigen::VectorXd::LinSpaced(3, 1.0, 3.0);
  Eigen::Tensor<double, 2> const table = Eigen::Tensor<double, 2>(2, 2).setConstant(4.0);
  if (me == 0) {
    sw::send(axis, sent, peer, 9);
    sw::send(axis, table, peer, 9);
    sw::send(axis, sent, peer, 9);
  } else {
    Eigen::VectorXf wrong_type;
    CHECK_THROWS_WITH_AS(sw::recv(axis, wrong_type, peer, 9),
                         doctest::Contains("sent 24 bytes for shape [3], but 12 are needed for this element type"),
                         sw::error);
    Eigen::VectorXd wrong_rank;
    CHECK_THROWS_WITH_AS(sw::recv(axis, wrong_rank, peer, 9),
                         doctest::Contains("sent a tensor of shape [2, 2] to a tensor of rank 1"), sw::error);
    Eigen::VectorXd got;
    sw::recv(axis, got, peer, 9);
    CHECK(got == sent);
  }
}

/// all_to_all_rows: rank q sends (q + 2 j) % 3 rows to rank j (some none), each row telling where it came from and
/// went; every rank receives exactly its rows, in rank order, and the counts. Counts that do not add up to a rank's
/// rows are refused on every rank with the same words.
template <class AxisMesh>
void check_all_to_all_rows(AxisMesh const& axis, std::string const& axis_name) {
  using Rows = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  int const n = axis.size(), me = axis.rank();
  auto const count = [](int q, int j) { return static_cast<std::size_t>((q + 2 * j) % 3); };
  auto const value = [](int q, int j, std::size_t i, int c) { return q * 1000.0 + j * 100.0 + double(i) * 10 + c; };
  std::vector<std::size_t> rows_to;
  Rows in(0, 3);
  for (int j = 0; j < n; ++j) {
    rows_to.push_back(count(me, j));
    for (std::size_t i = 0; i < count(me, j); ++i) {
      in.conservativeResize(in.rows() + 1, 3);
      for (int c = 0; c < 3; ++c) in(in.rows() - 1, c) = value(me, j, i, c);
    }
  }
  Rows out;
  std::vector<std::size_t> const received = sw::all_to_all_rows(axis, in, rows_to, out);
  Rows expected(0, 3);
  std::vector<std::size_t> expected_counts;
  for (int q = 0; q < n; ++q) {
    expected_counts.push_back(count(q, me));
    for (std::size_t i = 0; i < count(q, me); ++i) {
      expected.conservativeResize(expected.rows() + 1, 3);
      for (int c = 0; c < 3; ++c) expected(expected.rows() - 1, c) = value(q, me, i, c);
    }
  }
  CHECK(received == expected_counts);
  CHECK(out.rows() == expected.rows());
  CHECK(out == expected);
  std::vector<std::size_t> wrong = rows_to;
  if (me == 0) wrong[0] += 1;  // rank 0's counts add up to one row more than it holds
  std::string message;
  try {
    (void)sw::all_to_all_rows(axis, in, wrong, out);
  } catch (sw::error const& e) {
    message = e.what();
  }
  INFO(message);
  CHECK(message.find("shardwise::all_to_all_rows on mesh axis \"" + axis_name + "\": rank 0 sends ") !=
        std::string::npos);
  CHECK(message.find("rows to the ranks but holds [") != std::string::npos);
}

/// All collectives, on a 1-D mesh over the world and on both axes of a 2-D mesh.
template <class Types, class World>
void check_all_collectives(World const& world) {
  int const n = world.size();
  auto line = sw::make_mesh<"tp">(world, {n});
  check_recv_mismatch(line.template axis<"tp">());
  sw::barrier(line);
  check_all_to_all_rows(line.template axis<"tp">(), "tp");
  int const rows = n % 2 == 0 ? 2 : 1;
  auto grid = sw::make_mesh<"dp", "tp">(world, {rows, n / rows});
  Types::each([&]<class T>(char const* name) {
    INFO("tensor type " << name);
    check_collectives<T>(line, "tp", 0);
    check_collectives<T>(grid.template axis<"tp">(), "tp", 100 * grid.template coordinate<"dp">());
    check_collectives<T>(grid.template axis<"dp">(), "dp", 100 * grid.template coordinate<"tp">() + 50);
  });
}

}  // namespace cases
