#pragma once
// Attention across context-parallel ranks against nn::causal_attention of the whole sequences (fp64, forward
// and backward), on whatever world the test file hands over (threads or MPI): ring and all-to-all, head-tail
// balanced and contiguous cuts, sequence lengths the cut does not divide, grouped-query heads, and a sliding window
// shorter than a rank's share (a block of keys a window leaves out entirely, and panels it cuts); documents packed
// into the sequences, each attending within itself across the ranks.
#include <doctest/doctest.h>

#include <random>
#include <shardwise/context.hpp>
#include <shardwise/mesh/mesh.hpp>
#include <string>
#include <type_traits>
#include <vector>

namespace context_attention_cases {

namespace sw = shardwise;
using matrix = sw::nn::matrix<double>;

/// Values in [-1, 1) from `seed`: every rank draws the same whole tensors.
inline matrix random(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  std::mt19937 engine(seed);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = uniform(engine);
  return m;
}

struct Sizes {
  Eigen::Index batch, sequence, heads, kv_heads, head_dim;
  std::size_t block_rows;
  std::size_t window = 0;                // a sliding window of keys per query (0: none)
  std::vector<std::size_t> documents{};  // packed documents over the batch's sequences (empty: whole sequences)
  [[nodiscard]] sw::sequence_lengths rows() const {
    return documents.empty() ? sw::sequence_lengths::every(static_cast<std::size_t>(sequence))
                             : sw::sequence_lengths(documents);
  }
};

/// The whole sequences' inputs, and nn::causal_attention's output and gradients for them.
struct Whole {
  matrix q, k, v, dout, out, dq, dk, dv;
};

inline Whole reference(Sizes const& s) {
  Eigen::Index const rows = s.batch * s.sequence;
  Whole w{random(rows, s.heads * s.head_dim, 1),
          random(rows, s.kv_heads * s.head_dim, 2),
          random(rows, s.kv_heads * s.head_dim, 3),
          random(rows, s.heads * s.head_dim, 4),
          {},
          {},
          {},
          {}};
  w.out.resize(rows, w.q.cols()), w.dq.resize(rows, w.q.cols());
  w.dk.resize(rows, w.k.cols()), w.dv.resize(rows, w.k.cols());
  sw::nn::attention_saved<double> saved;
  auto const sequence = static_cast<std::size_t>(s.sequence), d = static_cast<std::size_t>(s.head_dim);
  sw::nn::causal_attention<double>(w.q, w.k, w.v, s.rows(), d, w.out, saved, s.block_rows, s.window);
  sw::nn::causal_attention_backward<double>(w.dout, w.q, w.k, w.v, saved, w.dq, w.dk, w.dv, s.block_rows);
  return w;
}

/// |got - expected| <= 1e-12 everywhere (the values and gradients are of order 1).
inline void check_close(matrix const& got, matrix const& expected, char const* what) {
  INFO(std::string(what));
  REQUIRE(got.rows() == expected.rows());
  REQUIRE(got.cols() == expected.cols());
  double const worst = (got - expected).cwiseAbs().maxCoeff();
  CHECK_MESSAGE(worst <= 1e-12, std::string(what) << " differs by " << worst);
}

enum class method { ring, all_to_all };

/// This rank's part of the attention across the cp mesh, forward and backward, against the whole's rows.
template <class Mesh>
void check_method(Mesh const& cp, Sizes const& s, Whole const& w, method m, bool balanced) {
  std::string const what = std::string(m == method::ring ? "ring" : "all-to-all") +
                           (balanced ? ", balanced" : ", contiguous") + ", sequence " + std::to_string(s.sequence) +
                           ", window " + std::to_string(s.window) + (s.documents.empty() ? "" : ", packed documents") +
                           ", cp " + std::to_string(cp.size());
  INFO(what);
  sw::context_split const split{static_cast<std::size_t>(s.sequence), cp.size(), balanced};
  int const rank = cp.rank();
  auto const mine = [&](matrix const& whole) { return split.rows_of<double>(whole, rank); };
  matrix const q = mine(w.q), k = mine(w.k), v = mine(w.v), dout = mine(w.dout);
  matrix out(q.rows(), q.cols()), dq(q.rows(), q.cols()), dk(k.rows(), k.cols()), dv(k.rows(), k.cols());
  sw::nn::attention_saved<double> saved;
  auto const d = static_cast<std::size_t>(s.head_dim);
  if (m == method::ring) {
    sw::ring_attention<Mesh, double>(cp, split, q, k, v, d, out, saved, s.block_rows, s.window,
                                     sw::sequence_lengths(s.documents));
    sw::ring_attention_backward<Mesh, double>(cp, split, dout, q, k, v, out, saved, dq, dk, dv, s.block_rows);
  } else {
    sw::ulysses_attention<Mesh, double>(cp, split, q, k, v, d, out, saved, s.block_rows, s.window,
                                        sw::sequence_lengths(s.documents));
    sw::ulysses_attention_backward<Mesh, double>(cp, split, dout, q, k, v, out, saved, dq, dk, dv, s.block_rows);
  }
  check_close(out, mine(w.out), "out");
  check_close(dq, mine(w.dq), "dq");
  check_close(dk, mine(w.dk), "dk");
  check_close(dv, mine(w.dv), "dv");
}

/// Every method and cut at the world's size, for sequences cp divides and does not, with grouped-query heads.
template <class World>
void check_all(World const& world) {
  int const n = world.size();
  auto const cp = sw::make_mesh<"cp">(world, {n});
  for (Eigen::Index sequence : {Eigen::Index{24}, Eigen::Index{37}, Eigen::Index{2 * n + 1}}) {
    // 4 query heads per key-value head for the ring; heads that divide over cp for all-to-all.
    Sizes const gqa{2, sequence, 8, 2, 4, 5};
    Sizes const divisible{2, sequence, 8, 4, 4, 5};
    Whole const w_gqa = reference(gqa), w_divisible = reference(divisible);
    for (bool balanced : {true, false}) {
      check_method(cp, gqa, w_gqa, method::ring, balanced);
      check_method(cp, divisible, w_divisible, method::ring, balanced);
      check_method(cp, divisible, w_divisible, method::all_to_all, balanced);
      if (n <= 2) check_method(cp, gqa, w_gqa, method::all_to_all, balanced);
    }
  }
  // A window of 4 keys on sequences of 37: each rank's share of a sequence (9 or more tokens) is longer, so some
  // blocks lie wholly outside every window of a panel, and panels of 5 rows start inside and outside it.
  Sizes const windowed{2, 37, 8, 2, 4, 5, 4}, windowed_divisible{2, 37, 8, 4, 4, 5, 4};
  Whole const w_windowed = reference(windowed), w_windowed_divisible = reference(windowed_divisible);
  for (bool balanced : {true, false}) {
    check_method(cp, windowed, w_windowed, method::ring, balanced);
    check_method(cp, windowed_divisible, w_windowed_divisible, method::all_to_all, balanced);
  }
  // Documents packed into the two sequences of 37 (a document of 1, one as long as a sequence, ones that end
  // inside a rank's chunk), with and without a window: each attends within itself across the ranks.
  for (std::size_t window : {0u, 4u}) {
    Sizes const packed{2, 37, 8, 2, 4, 5, window, {5, 1, 20, 11, 37}};
    Sizes const packed_divisible{2, 37, 8, 4, 4, 5, window, {5, 1, 20, 11, 37}};
    Whole const w_packed = reference(packed), w_packed_divisible = reference(packed_divisible);
    for (bool balanced : {true, false}) {
      check_method(cp, packed, w_packed, method::ring, balanced);
      check_method(cp, packed_divisible, w_packed_divisible, method::all_to_all, balanced);
    }
  }
}

/// Mistakes are refused with words that name the fix, on every rank.
template <class World>
void check_refusals(World const& world) {
  int const n = world.size();
  auto const cp = sw::make_mesh<"cp">(world, {n});
  matrix const q = random(2 * 3, 8, 5), k = random(2 * 3, 4, 6);
  matrix out(q.rows(), q.cols());
  sw::nn::attention_saved<double> saved;
  sw::context_split const other{static_cast<std::size_t>(6 * n), n + 1};
  using Mesh = std::remove_cvref_t<decltype(cp)>;
  auto const ring_over = [&](sw::context_split const& split) {
    sw::ring_attention<Mesh, double>(cp, split, q, k, k, 4, out, saved);
  };
  std::string const mismatch =
      "the context_split is over " + std::to_string(n + 1) + " ranks but the cp mesh has " + std::to_string(n);
  CHECK_THROWS_WITH_AS(ring_over(other), doctest::Contains(mismatch.c_str()), sw::error);
  sw::context_split const too_short{3, 4};
  CHECK_THROWS_WITH_AS((void)too_short.positions(0),
                       doctest::Contains("a sequence of 3 tokens over 4 context-parallel ranks leaves a rank "
                                         "without tokens"),
                       sw::error);
  if (n < 2) return;
  sw::context_split const split{static_cast<std::size_t>(6 * n), n};  // 3 tokens per sequence on each rank
  matrix const one_kv_head = random(2 * 3, 4, 7);                     // 2 query heads of 4, 1 key-value head
  auto const all_to_all = [&] {
    sw::ulysses_attention<Mesh, double>(cp, split, q, one_kv_head, one_kv_head, 4, out, saved);
  };
  std::string const undivided = "2 query and 1 key-value heads do not divide over " + std::to_string(n) +
                                " context-parallel ranks; use ring_attention";
  CHECK_THROWS_WITH_AS(all_to_all(), doctest::Contains(undivided.c_str()), sw::error);
}

}  // namespace context_attention_cases
