// The nn kernels in double: forward against naive loops written here, backward against central finite differences
// of a scalar function of the forward (sum(y .* R) for a fixed random R); then float against double.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <shardwise/inference/cached_attention.hpp>
#include <shardwise/nn/kernels/blas_check.hpp>
#include <shardwise/nn/kernels/functional.hpp>
#include <shardwise/nn/kernels/functional_attention.hpp>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "support/materialized_attention.hpp"

namespace nn = shardwise::nn;
using mat = nn::matrix<double>;
using vec = nn::vector<double>;
using Eigen::Index;

namespace {

mat random_matrix(Index rows, Index cols, unsigned seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  mat m(rows, cols);
  for (Index k = 0; k < m.size(); ++k) m.data()[k] = dist(gen);
  return m;
}
vec random_vector(Index n, unsigned seed, double lo = -1.0, double hi = 1.0) {
  mat m = random_matrix(n, 1, seed, lo, hi);
  return Eigen::Map<vec>(m.data(), n);
}

// Max-norm relative error max|a - b| / max|b|: element-wise relative error is meaningless where b is ~0.
template <class A, class B>
double rel_err(Eigen::DenseBase<A> const& a, Eigen::DenseBase<B> const& b) {
  REQUIRE(a.rows() == b.rows());
  REQUIRE(a.cols() == b.cols());
  double const scale = b.derived().template cast<double>().cwiseAbs().maxCoeff();
  double const diff = (a.derived().template cast<double>() - b.derived().template cast<double>()).cwiseAbs().maxCoeff();
  return scale == 0 ? diff : diff / scale;
}

// Central finite differences of loss() with respect to every element of p, which loss() reads.
template <class M, class F>
M numeric_grad(M& p, F&& loss, double h = 1e-6) {
  M grad(p.rows(), p.cols());
  for (Index k = 0; k < p.size(); ++k) {
    double const saved = p.data()[k];
    p.data()[k] = saved + h;
    double const up = loss();
    p.data()[k] = saved - h;
    double const down = loss();
    p.data()[k] = saved;
    grad.data()[k] = (up - down) / (2 * h);
  }
  return grad;
}

double weighted_sum(mat const& y, mat const& r) { return y.cwiseProduct(r).sum(); }

constexpr double grad_tol = 1e-6;

}  // namespace

TEST_CASE("OpenBLAS's kernels below the CPU's: the advice names the kernels to ask for, and only then") {
  using shardwise::detail::cpu_vectors;
  using shardwise::detail::openblas_kernel_advice;
  cpu_vectors const avx512{true, true}, avx2{true, false}, sse_only{false, false};
  std::string const emerald = openblas_kernel_advice("Prescott", avx512);
  CHECK(emerald.find("runs its Prescott kernels") != std::string::npos);
  CHECK(emerald.find("OPENBLAS_CORETYPE=SkylakeX") != std::string::npos);
  CHECK(openblas_kernel_advice("Sandybridge", avx2).find("OPENBLAS_CORETYPE=Haswell") != std::string::npos);
  CHECK(openblas_kernel_advice("Nehalem", avx2).find("AVX2 and FMA") != std::string::npos);
  for (char const* fast : {"Haswell", "Zen", "SkylakeX", "Cooperlake", "SapphireRapids"})
    CHECK(openblas_kernel_advice(fast, avx512).empty());
  CHECK(openblas_kernel_advice("Prescott", sse_only).empty());  // nothing faster to ask for
}

TEST_CASE("linear: forward against loops, backward against finite differences, accumulation, slices") {
  Index const n = 5, in = 4, out = 3;
  mat x = random_matrix(n, in, 1), w = random_matrix(out, in, 2), r = random_matrix(n, out, 3);
  vec b = random_vector(out, 4);

  mat y(n, out), y_nobias(n, out);
  nn::linear_forward<double>(x, w, b, y);
  nn::linear_forward<double>(x, w, std::nullopt, y_nobias);
  mat naive(n, out), naive_nobias(n, out);
  for (Index i = 0; i < n; ++i)
    for (Index j = 0; j < out; ++j) {
      double s = 0;
      for (Index k = 0; k < in; ++k) s += x(i, k) * w(j, k);
      naive_nobias(i, j) = s;
      naive(i, j) = s + b(j);
    }
  CHECK(rel_err(y, naive) < 1e-14);
  CHECK(rel_err(y_nobias, naive_nobias) < 1e-14);

  // A column slice of a wider output, as a column-parallel layer writes its shard: the rest is untouched.
  mat wide = mat::Constant(n, out + 3, 7.0);
  nn::linear_forward<double>(x, w, b, wide.middleCols(2, out));
  CHECK(rel_err(wide.middleCols(2, out), naive) < 1e-14);
  CHECK((wide.leftCols(2).array() == 7.0).all());
  CHECK((wide.rightCols(1).array() == 7.0).all());
  // And a column slice of a wider input, as a row-parallel layer reads its shard.
  mat wide_x = random_matrix(n, in + 2, 9);
  wide_x.middleCols(1, in) = x;
  mat y_from_slice(n, out);
  nn::linear_forward<double>(wide_x.middleCols(1, in), w, b, y_from_slice);
  CHECK(rel_err(y_from_slice, naive) < 1e-14);

  auto loss = [&] {
    mat yy(n, out);
    nn::linear_forward<double>(x, w, b, yy);
    return weighted_sum(yy, r);
  };
  // Parameter gradients start non-zero: the kernel must add to them.
  mat const dw0 = random_matrix(out, in, 5);
  vec const db0 = random_vector(out, 6);
  mat dx(n, in), dw = dw0;
  vec db = db0;
  nn::linear_backward<double>(x, w, r, dx, dw, db);  // dL/dy = R
  mat const dx_num = numeric_grad(x, loss), dw_num = numeric_grad(w, loss);
  vec const db_num = numeric_grad(b, loss);
  CHECK(rel_err(dx, dx_num) < grad_tol);
  CHECK(rel_err(dw - dw0, dw_num) < grad_tol);
  CHECK(rel_err(db - db0, db_num) < grad_tol);

  // No dx and no dbias: dweight alone, accumulating a second time.
  nn::linear_backward<double>(x, w, r, std::nullopt, dw, std::nullopt);
  CHECK(rel_err(dw - dw0, 2 * dw_num) < grad_tol);

  mat bad(n, out + 1);
  CHECK_THROWS_WITH_AS(nn::linear_forward<double>(x, w, b, bad),
                       doctest::Contains("shardwise::nn::linear_forward: y [N, out] is 5x4, expected 5x3"),
                       shardwise::error);
  mat bad_w(out, in + 1);
  CHECK_THROWS_AS(nn::linear_forward<double>(x, bad_w, std::nullopt, y), shardwise::error);
}

TEST_CASE("embedding: lookup, vocabulary-slice masking, scatter-add backward") {
  Index const rows = 4, d = 3;
  std::int64_t const start = 5;  // this table holds ids 5..8 of a larger vocabulary
  mat table = random_matrix(rows, d, 10);
  std::vector<std::int64_t> const ids = {
      5, 8, 9, 4, -1, 7, 7, 0, std::numeric_limits<std::int64_t>::min(), std::numeric_limits<std::int64_t>::max()};
  auto const n = static_cast<Index>(ids.size());
  mat out = mat::Constant(n, d, 42.0);  // stale values must be overwritten, zeros included
  nn::embedding_forward<double>(ids, table, out, start);
  for (Index i = 0; i < n; ++i) {
    std::int64_t const id = ids[static_cast<std::size_t>(i)];
    CAPTURE(id);
    if (id >= start && id < start + rows)
      CHECK(out.row(i) == table.row(id - start));
    else
      CHECK(out.row(i).isZero(0));
  }

  // Backward: numeric gradient with respect to the table; ids outside the slice contribute nothing, 7 twice.
  mat const r = random_matrix(n, d, 11);
  auto loss = [&] {
    mat o(n, d);
    nn::embedding_forward<double>(ids, table, o, start);
    return weighted_sum(o, r);
  };
  mat const dtable0 = random_matrix(rows, d, 12);
  mat dtable = dtable0;
  nn::embedding_backward<double>(ids, r, dtable, start);
  CHECK(rel_err(dtable - dtable0, numeric_grad(table, loss)) < grad_tol);
  // Loop form of the same: the row of id 7 (local 2) gets both dout rows 5 and 6; local row 1 (id 6) none.
  CHECK(rel_err(dtable.row(2) - dtable0.row(2), r.row(5) + r.row(6)) < 1e-14);
  CHECK(dtable.row(1) == dtable0.row(1));
  CHECK(rel_err(dtable.row(0) - dtable0.row(0), r.row(0)) < 1e-14);
  CHECK(rel_err(dtable.row(3) - dtable0.row(3), r.row(1)) < 1e-14);

  // Two vocabulary slices sum to the unsliced lookup; vocab_start defaults to 0.
  mat full = random_matrix(8, d, 13);
  std::vector<std::int64_t> const in_vocab = {0, 3, 4, 7, 2};
  mat whole(5, d), lo(5, d), hi(5, d);
  nn::embedding_forward<double>(in_vocab, full, whole);
  nn::embedding_forward<double>(in_vocab, full.topRows(4), lo, 0);
  nn::embedding_forward<double>(in_vocab, full.bottomRows(4), hi, 4);
  for (Index i = 0; i < 5; ++i) CHECK(whole.row(i) == full.row(in_vocab[static_cast<std::size_t>(i)]));
  CHECK(lo + hi == whole);

  CHECK_THROWS_AS(nn::embedding_forward<double>(ids, table, out, -1), shardwise::error);
  mat bad(n + 1, d);
  CHECK_THROWS_AS(nn::embedding_forward<double>(ids, table, bad, start), shardwise::error);
}

TEST_CASE("layer_norm: matches the definition of torch.nn.LayerNorm; backward") {
  Index const n = 4, d = 6;
  double const eps = 1e-5;
  // An offset mean, as real activations have: checks the two-pass variance too.
  mat x = random_matrix(n, d, 20, 2.0, 4.0), r = random_matrix(n, d, 21);
  vec gamma = random_vector(d, 22, 0.5, 1.5), beta = random_vector(d, 23);
  mat y(n, d);
  vec mean(n), rstd(n);
  nn::layer_norm_forward<double>(x, gamma, beta, eps, y, mean, rstd);
  for (Index i = 0; i < n; ++i) {
    double mu = 0, var = 0;
    for (Index j = 0; j < d; ++j) mu += x(i, j);
    mu /= static_cast<double>(d);
    for (Index j = 0; j < d; ++j) var += (x(i, j) - mu) * (x(i, j) - mu);
    var /= static_cast<double>(d);  // biased, as torch
    CHECK(mean(i) == doctest::Approx(mu).epsilon(1e-14));
    CHECK(rstd(i) == doctest::Approx(1 / std::sqrt(var + eps)).epsilon(1e-12));
    for (Index j = 0; j < d; ++j)
      CHECK(y(i, j) == doctest::Approx((x(i, j) - mu) / std::sqrt(var + eps) * gamma(j) + beta(j)).epsilon(1e-12));
  }

  auto loss = [&] {
    mat yy(n, d);
    vec m(n), s(n);
    nn::layer_norm_forward<double>(x, gamma, beta, eps, yy, m, s);
    return weighted_sum(yy, r);
  };
  vec const dgamma0 = random_vector(d, 24), dbeta0 = random_vector(d, 25);
  mat dx(n, d);
  vec dgamma = dgamma0, dbeta = dbeta0;
  nn::layer_norm_backward<double>(x, gamma, r, mean, rstd, dx, dgamma, dbeta);
  CHECK(rel_err(dx, numeric_grad(x, loss)) < grad_tol);
  CHECK(rel_err(dgamma - dgamma0, numeric_grad(gamma, loss)) < grad_tol);
  CHECK(rel_err(dbeta - dbeta0, numeric_grad(beta, loss)) < grad_tol);

  // dx written over dy.
  mat inplace = r;
  vec g2 = vec::Zero(d), b2 = vec::Zero(d);
  nn::layer_norm_backward<double>(x, gamma, inplace, mean, rstd, inplace, g2, b2);
  CHECK(rel_err(inplace, dx) < 1e-14);
  CHECK(rel_err(g2, dgamma - dgamma0) < 1e-12);

  vec bad(d + 1);
  CHECK_THROWS_WITH_AS(nn::layer_norm_forward<double>(x, bad, beta, eps, y, mean, rstd),
                       doctest::Contains("layer_norm_forward: gamma [D] has 7 elements, expected 6"), shardwise::error);
}

TEST_CASE("rms_norm: matches Llama's RMSNorm; backward") {
  Index const n = 4, d = 6;
  double const eps = 1e-6;
  mat x = random_matrix(n, d, 30, -2.0, 2.0), r = random_matrix(n, d, 31);
  vec weight = random_vector(d, 32, 0.5, 1.5);
  mat y(n, d);
  vec rstd(n);
  nn::rms_norm_forward<double>(x, weight, eps, y, rstd);
  for (Index i = 0; i < n; ++i) {
    double ms = 0;
    for (Index j = 0; j < d; ++j) ms += x(i, j) * x(i, j);
    ms /= static_cast<double>(d);
    CHECK(rstd(i) == doctest::Approx(1 / std::sqrt(ms + eps)).epsilon(1e-12));
    for (Index j = 0; j < d; ++j)
      CHECK(y(i, j) == doctest::Approx(x(i, j) / std::sqrt(ms + eps) * weight(j)).epsilon(1e-12));
  }

  auto loss = [&] {
    mat yy(n, d);
    vec s(n);
    nn::rms_norm_forward<double>(x, weight, eps, yy, s);
    return weighted_sum(yy, r);
  };
  vec const dweight0 = random_vector(d, 33);
  mat dx(n, d);
  vec dweight = dweight0;
  nn::rms_norm_backward<double>(x, weight, r, rstd, dx, dweight);
  CHECK(rel_err(dx, numeric_grad(x, loss)) < grad_tol);
  CHECK(rel_err(dweight - dweight0, numeric_grad(weight, loss)) < grad_tol);

  mat inplace = r;
  vec w2 = vec::Zero(d);
  nn::rms_norm_backward<double>(x, weight, inplace, rstd, inplace, w2);
  CHECK(rel_err(inplace, dx) < 1e-14);
  CHECK(rel_err(w2, dweight - dweight0) < 1e-12);
}

namespace {
// One activation: its kernels and its definition, written as a scalar formula.
struct activation_case {
  char const* name;
  void (*forward)(nn::const_matrix_ref<double>, nn::matrix_ref<double>);
  void (*backward)(nn::const_matrix_ref<double>, nn::const_matrix_ref<double>, nn::matrix_ref<double>);
  double (*naive)(double);
};
double naive_relu(double x) { return x > 0 ? x : 0.0; }
double naive_silu(double x) { return x / (1 + std::exp(-x)); }
double naive_gelu(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }
double naive_gelu_tanh(double x) {
  double const pi = 3.14159265358979323846;
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / pi) * (x + 0.044715 * x * x * x)));
}
}  // namespace

TEST_CASE("activations: relu, silu, gelu, gelu tanh") {
  activation_case const cases[] = {
      {"relu", nn::relu_forward<double>, nn::relu_backward<double>, naive_relu},
      {"silu", nn::silu_forward<double>, nn::silu_backward<double>, naive_silu},
      {"gelu", nn::gelu_forward<double>, nn::gelu_backward<double>, naive_gelu},
      {"gelu_tanh", nn::gelu_tanh_forward<double>, nn::gelu_tanh_backward<double>, naive_gelu_tanh},
  };
  Index const n = 5, d = 7;
  mat x0 = random_matrix(n, d, 40, -4.0, 4.0);
  // Away from relu's kink at 0, where a finite difference straddles it.
  for (Index k = 0; k < x0.size(); ++k)
    if (std::abs(x0.data()[k]) < 0.05) x0.data()[k] = 0.5;
  mat const r = random_matrix(n, d, 41);
  for (auto const& c : cases) {
    CAPTURE(c.name);
    mat x = x0, y(n, d);
    c.forward(x, y);
    mat naive(n, d);
    for (Index k = 0; k < x.size(); ++k) naive.data()[k] = c.naive(x.data()[k]);
    CHECK(rel_err(y, naive) < 1e-13);

    auto loss = [&] {
      mat yy(n, d);
      c.forward(x, yy);
      return weighted_sum(yy, r);
    };
    mat dx(n, d);
    c.backward(x, r, dx);
    CHECK(rel_err(dx, numeric_grad(x, loss)) < grad_tol);

    // In place: y over x, dx over dy.
    mat in_place = x;
    c.forward(in_place, in_place);
    CHECK(rel_err(in_place, y) < 1e-15);
    mat d_in_place = r;
    c.backward(x, d_in_place, d_in_place);
    CHECK(rel_err(d_in_place, dx) < 1e-15);

    // Far tails stay finite (no exp overflow turning into inf * 0).
    mat tails(1, 2), tails_out(1, 2), tails_dx(1, 2);
    tails << -1000.0, 1000.0;
    c.forward(tails, tails_out);
    c.backward(tails, mat::Ones(1, 2), tails_dx);
    CHECK(tails_out.allFinite());
    CHECK(tails_dx.allFinite());
    CHECK(tails_out(0, 1) == doctest::Approx(1000.0));
    CHECK(tails_dx(0, 1) == doctest::Approx(1.0));
  }
  mat zero = mat::Zero(1, 1), dzero(1, 1);
  nn::relu_backward<double>(zero, mat::Ones(1, 1), dzero);
  CHECK(dzero(0, 0) == 0.0);  // torch's subgradient at 0
}

TEST_CASE("cross_entropy: mean over non-ignored targets, gradient, ignore_index, stability") {
  Index const n = 6, v = 5;
  mat logits = random_matrix(n, v, 50, -3.0, 3.0);
  std::vector<std::int64_t> const targets = {1, -100, 4, 0, -100, 2};

  auto naive_loss = [&](mat const& l, std::vector<std::int64_t> const& t, std::int64_t ignore) {
    double sum = 0;
    int count = 0;
    for (Index i = 0; i < l.rows(); ++i) {
      std::int64_t const c = t[static_cast<std::size_t>(i)];
      if (c == ignore) continue;
      double z = 0;
      for (Index j = 0; j < l.cols(); ++j) z += std::exp(l(i, j));
      sum += std::log(z) - l(i, c);
      ++count;
    }
    return sum / count;
  };

  mat dlogits = mat::Constant(n, v, 9.0);
  double const loss = nn::cross_entropy_forward_backward<double>(logits, targets, dlogits);
  CHECK(loss == doctest::Approx(naive_loss(logits, targets, -100)).epsilon(1e-13));
  auto loss_of = [&] {
    mat scratch(n, v);
    return nn::cross_entropy_forward_backward<double>(logits, targets, scratch);
  };
  CHECK(rel_err(dlogits, numeric_grad(logits, loss_of)) < grad_tol);
  CHECK(dlogits.row(1).isZero(0));
  CHECK(dlogits.row(4).isZero(0));
  // Each counted row of the gradient sums to 0 (softmax minus one-hot), over 4 counted rows.
  CHECK(std::abs(dlogits.row(0).sum()) < 1e-15);
  CHECK(dlogits(0, 1) == doctest::Approx((std::exp(logits(0, 1)) / logits.row(0).array().exp().sum() - 1) / 4));

  // Another ignore_index, one that is also a valid class: rows with target 2 drop out, -100 is then out of range.
  std::vector<std::int64_t> const targets2 = {1, 2, 4, 0, 2, 2};
  mat d2(n, v);
  double const loss2 = nn::cross_entropy_forward_backward<double>(logits, targets2, d2, 2);
  CHECK(loss2 == doctest::Approx(naive_loss(logits, targets2, 2)).epsilon(1e-13));
  CHECK(d2.row(1).isZero(0));
  CHECK(d2.row(5).isZero(0));
  CHECK_THROWS_WITH_AS(nn::cross_entropy_forward_backward<double>(logits, targets, d2, 2),
                       doctest::Contains("target -100 is outside [0, 5) and is not ignore_index (2)"),
                       shardwise::error);

  // Every target ignored: 0 and a zero gradient (torch gives NaN).
  std::vector<std::int64_t> const none(static_cast<std::size_t>(n), -100);
  mat d3 = mat::Constant(n, v, 9.0);
  CHECK(nn::cross_entropy_forward_backward<double>(logits, none, d3) == 0.0);
  CHECK(d3.isZero(0));

  // Shifting a row by a constant changes nothing, even where exp would overflow without the max subtraction.
  mat shifted = logits.array() + 1000.0;
  mat d4(n, v);
  double const loss4 = nn::cross_entropy_forward_backward<double>(shifted, targets, d4);
  CHECK(loss4 == doctest::Approx(loss).epsilon(1e-10));
  CHECK(rel_err(d4, dlogits) < 1e-10);

  // In place: dlogits over logits.
  mat in_place = logits;
  double const loss5 = nn::cross_entropy_forward_backward<double>(in_place, targets, in_place);
  CHECK(loss5 == loss);
  CHECK(rel_err(in_place, dlogits) < 1e-15);

  std::vector<std::int64_t> const short_targets = {1, 2};
  CHECK_THROWS_AS(nn::cross_entropy_forward_backward<double>(logits, short_targets, d2), shardwise::error);
}

namespace {
// Runs every kernel in T on the same inputs (given in double) and returns all outputs, in double, in one list.
template <class T>
std::vector<mat> run_all(mat const& x, mat const& w, vec const& b, mat const& r_lin, mat const& r_norm,
                         std::vector<std::int64_t> const& ids, std::vector<std::int64_t> const& targets) {
  using M = nn::matrix<T>;
  using V = nn::vector<T>;
  Index const n = x.rows(), d = x.cols(), out = w.rows();
  M const xt = x.cast<T>(), wt = w.cast<T>(), rl = r_lin.cast<T>(), rn = r_norm.cast<T>();
  V const bt = b.cast<T>(), gamma = V::LinSpaced(d, T(0.5), T(1.5)), beta = V::LinSpaced(d, T(-0.2), T(0.3));
  std::vector<mat> results;
  auto keep = [&](auto const& m) { results.push_back(m.template cast<double>()); };

  M y(n, out), dx(n, d), dw = M::Zero(out, d);
  V db = V::Zero(out);
  nn::linear_forward<T>(xt, wt, bt, y);
  nn::linear_backward<T>(xt, wt, rl, dx, dw, db);
  keep(y), keep(dx), keep(dw), keep(db);

  M e(static_cast<Index>(ids.size()), d), dtable = M::Zero(n, d);
  nn::embedding_forward<T>(ids, xt, e, 2);
  nn::embedding_backward<T>(ids, e, dtable, 2);
  keep(e), keep(dtable);

  M yn(n, d), dxn(n, d);
  V mean(n), rstd(n), dg = V::Zero(d), dbeta = V::Zero(d);
  nn::layer_norm_forward<T>(xt, gamma, beta, T(1e-5), yn, mean, rstd);
  nn::layer_norm_backward<T>(xt, gamma, rn, mean, rstd, dxn, dg, dbeta);
  keep(yn), keep(dxn), keep(dg), keep(dbeta), keep(mean), keep(rstd);
  V dwr = V::Zero(d);
  nn::rms_norm_forward<T>(xt, gamma, T(1e-6), yn, rstd);
  nn::rms_norm_backward<T>(xt, gamma, rn, rstd, dxn, dwr);
  keep(yn), keep(dxn), keep(dwr), keep(rstd);

  using forward_fn = void (*)(nn::const_matrix_ref<T>, nn::matrix_ref<T>);
  using backward_fn = void (*)(nn::const_matrix_ref<T>, nn::const_matrix_ref<T>, nn::matrix_ref<T>);
  std::pair<forward_fn, backward_fn> const activations[] = {{nn::relu_forward<T>, nn::relu_backward<T>},
                                                            {nn::silu_forward<T>, nn::silu_backward<T>},
                                                            {nn::gelu_forward<T>, nn::gelu_backward<T>},
                                                            {nn::gelu_tanh_forward<T>, nn::gelu_tanh_backward<T>}};
  for (auto [f, bwd] : activations) {
    f(xt, yn);
    bwd(xt, rn, dxn);
    keep(yn), keep(dxn);
  }

  M dl(n, d);
  T const loss = nn::cross_entropy_forward_backward<T>(xt, targets, dl);
  keep(dl);
  keep(M::Constant(1, 1, loss));
  return results;
}
}  // namespace

TEST_CASE("causal_attention: against a loop over sequences, heads and keys; backward against finite differences") {
  // 2 sequences of 3 tokens, 4 query heads reading 2 key-value heads, head_dim 2.
  Index const s = 3, d = 2, heads = 4, kv_heads = 2, tokens = 6;
  mat q = random_matrix(tokens, heads * d, 81), k = random_matrix(tokens, kv_heads * d, 82);
  mat v = random_matrix(tokens, kv_heads * d, 83);
  mat const r = random_matrix(tokens, heads * d, 84);
  nn::attention_saved<double> saved;
  mat out(tokens, heads * d);
  nn::causal_attention<double>(q, k, v, std::size_t(s), std::size_t(d), out, saved);
  mat expected = mat::Zero(tokens, heads * d);  // softmax over keys j <= i of the same sequence, written plainly
  for (Index b = 0; b < tokens / s; ++b)
    for (Index h = 0; h < heads; ++h)
      for (Index i = 0; i < s; ++i) {
        Index const kv = h / (heads / kv_heads);
        std::vector<double> w(std::size_t(i + 1));
        double total = 0;
        for (Index j = 0; j <= i; ++j) {
          double dot = 0;
          for (Index c = 0; c < d; ++c) dot += q(b * s + i, h * d + c) * k(b * s + j, kv * d + c);
          total += w[std::size_t(j)] = std::exp(dot / std::sqrt(double(d)));
        }
        for (Index j = 0; j <= i; ++j)
          for (Index c = 0; c < d; ++c)
            expected(b * s + i, h * d + c) += w[std::size_t(j)] / total * v(b * s + j, kv * d + c);
      }
  CHECK(rel_err(out, expected) <= 1e-14);
  mat dq(tokens, heads * d), dk(tokens, kv_heads * d), dv(tokens, kv_heads * d);
  nn::causal_attention_backward<double>(r, q, k, v, saved, dq, dk, dv);
  auto loss = [&] {
    nn::attention_saved<double> again;
    mat y(tokens, heads * d);
    nn::causal_attention<double>(q, k, v, std::size_t(s), std::size_t(d), y, again);
    return weighted_sum(y, r);
  };
  CHECK(rel_err(dq, numeric_grad(q, loss)) <= 1e-8);
  CHECK(rel_err(dk, numeric_grad(k, loss)) <= 1e-8);
  CHECK(rel_err(dv, numeric_grad(v, loss)) <= 1e-8);
  mat odd(5, heads * d);  // not whole sequences
  CHECK_THROWS_WITH_AS(nn::causal_attention<double>(q.topRows(5), k.topRows(5), v.topRows(5), std::size_t(s),
                                                    std::size_t(d), odd, saved),
                       doctest::Contains("are not whole sequences of 3"), shardwise::error);
}

// The blocked attention against the materialized one it replaced (tests/support/materialized_attention.hpp),
// forward and backward, in T: sequences the block divides and does not, one-row and whole-sequence blocks, a
// backward blocked differently from its forward, multi-head, grouped-query and multi-query heads, and scores past
// exp's overflow. The outputs start as NaN, so a block left unwritten fails.
struct attention_case {
  Index sequence, forward_block, backward_block, heads, kv_heads;
  double shift = 0;  // added to every score of a row (q's and k's first column of each head set to sqrt of it)
};

template <class T>
void check_blocked_attention(attention_case const& c, double tolerance) {
  using M = nn::matrix<T>;
  Index const s = c.sequence, d = 8, tokens = 2 * s;
  INFO("sequence ", s, ", blocks ", c.forward_block, "/", c.backward_block, ", heads ", c.heads, "/", c.kv_heads,
       ", shift ", c.shift);
  auto draw = [&](Index cols, unsigned seed) {
    M m = random_matrix(tokens, cols, seed).cast<T>();
    if (seed <= 2)  // q and k: a per-row constant on every score, which the softmax must not overflow on
      for (Index h = 0; h < cols / d; ++h) m.col(h * d).setConstant(T(std::sqrt(c.shift * std::sqrt(double(d)))));
    return m;
  };
  M const q = draw(c.heads * d, 1), k = draw(c.kv_heads * d, 2), v = draw(c.kv_heads * d, 3);
  M const dout = draw(c.heads * d, 4);
  double const top = (q.leftCols(d) * k.leftCols(d).transpose()).maxCoeff() / std::sqrt(double(d));
  if (c.shift > 0) CHECK(top > std::log(double(std::numeric_limits<T>::max())));  // exp(top) overflows T
  ref::materialized_attention<T> reference;
  M out_ref, dq_ref, dk_ref, dv_ref;
  reference.forward(q, k, v, s, d, out_ref);
  reference.backward(dout, q, k, v, dq_ref, dk_ref, dv_ref);
  nn::attention_saved<T> saved;
  T const nan = std::numeric_limits<T>::quiet_NaN();
  M out = M::Constant(tokens, c.heads * d, nan), dq = M::Constant(tokens, c.heads * d, nan);
  M dk = M::Constant(tokens, c.kv_heads * d, nan), dv = M::Constant(tokens, c.kv_heads * d, nan);
  nn::causal_attention<T>(q, k, v, std::size_t(s), std::size_t(d), out, saved, std::size_t(c.forward_block));
  CHECK(saved.logsumexp.size() * Index(sizeof(T)) ==
        Index(nn::attention_saved_bytes<T>(std::size_t(tokens), std::size_t(c.heads))));
  nn::causal_attention_backward<T>(dout, q, k, v, saved, dq, dk, dv, std::size_t(c.backward_block));
  CHECK(rel_err(out, out_ref) <= tolerance);
  CHECK(rel_err(dq, dq_ref) <= tolerance);
  CHECK(rel_err(dk, dk_ref) <= tolerance);
  CHECK(rel_err(dv, dv_ref) <= tolerance);
}

TEST_CASE("blocked causal_attention equals the materialized attention it replaced, forward and backward") {
  for (auto [s, fb, bb] : {std::tuple<Index, Index, Index>{1, 128, 128},
                           {5, 2, 2},
                           {64, 64, 64},
                           {100, 64, 64},
                           {100, 7, 7},
                           {257, 128, 128},
                           {257, 1, 1},
                           {100, 7, 64},
                           {257, 128, 5}})
    for (auto [heads, kv_heads] : {std::pair<Index, Index>{4, 4}, {4, 2}, {4, 1}}) {
      check_blocked_attention<double>({s, fb, bb, heads, kv_heads}, 1e-12);
      check_blocked_attention<float>({s, fb, bb, heads, kv_heads}, 1e-5);
    }
  // Scores shifted past where exp overflows (709.8 in double, 88.7 in float): the row's largest must come out
  // first. The backward's exp(score - logsumexp) loses |score| x epsilon of its exponent, as FlashAttention's
  // does, and the gradients' cancellations magnify it (3.6e-12 measured in double): 1e-10 and 1e-4 here.
  check_blocked_attention<double>({100, 16, 16, 4, 2, 900.0}, 1e-10);
  check_blocked_attention<float>({100, 16, 16, 4, 2, 120.0}, 1e-4);
}

TEST_CASE("causal_attention over packed sequences equals each sequence attended alone, forward and backward") {
  // Documents of 5, 1, 9 and 3 rows back to back; panels of 4 rows forward and 2 backward, so panels end inside
  // documents and documents end inside panels. Each document alone (a batch of one sequence) is the reference.
  std::vector<std::size_t> const lengths = {5, 1, 9, 3};
  Index const d = 8, heads = 4, kv_heads = 2, tokens = 18;
  for (std::size_t block : {std::size_t(4), std::size_t(128)}) {
    INFO("forward block ", block);
    mat const q = random_matrix(tokens, heads * d, 91), k = random_matrix(tokens, kv_heads * d, 92);
    mat const v = random_matrix(tokens, kv_heads * d, 93), dout = random_matrix(tokens, heads * d, 94);
    nn::attention_saved<double> saved;
    mat out = mat::Constant(tokens, heads * d, std::nan("")), dq(tokens, heads * d), dk(tokens, kv_heads * d),
        dv(tokens, kv_heads * d);
    nn::causal_attention<double>(q, k, v, shardwise::sequence_lengths(lengths), std::size_t(d), out, saved, block);
    nn::causal_attention_backward<double>(dout, q, k, v, saved, dq, dk, dv, 2);
    Index first = 0;
    for (std::size_t n : lengths) {
      auto const rows = Index(n);
      auto const part = [&](mat const& m) { return mat(m.middleRows(first, rows)); };
      nn::attention_saved<double> alone;
      mat o(rows, heads * d), gq(rows, heads * d), gk(rows, kv_heads * d), gv(rows, kv_heads * d);
      nn::causal_attention<double>(part(q), part(k), part(v), n, std::size_t(d), o, alone);
      nn::causal_attention_backward<double>(part(dout), part(q), part(k), part(v), alone, gq, gk, gv);
      CHECK(rel_err(part(out), o) <= 1e-14);
      CHECK(rel_err(part(dq), gq) <= 1e-14);
      CHECK(rel_err(part(dk), gk) <= 1e-14);
      CHECK(rel_err(part(dv), gv) <= 1e-14);
      first += rows;
    }
  }
  mat const q = random_matrix(6, 8, 1), k = random_matrix(6, 4, 2);
  mat out(6, 8);
  nn::attention_saved<double> saved;
  CHECK_THROWS_WITH_AS(nn::causal_attention<double>(q, k, k, shardwise::sequence_lengths{2, 3}, 2, out, saved),
                       doctest::Contains("causal_attention: the sequence lengths add up to 5 rows but the batch has 6"),
                       shardwise::error);
  CHECK_THROWS_WITH_AS(nn::causal_attention<double>(q, k, k, shardwise::sequence_lengths{2, 0, 4}, 2, out, saved),
                       doctest::Contains("causal_attention: sequence 1 has 0 rows"), shardwise::error);
  CHECK_THROWS_WITH_AS(nn::causal_attention<double>(q, k, k, shardwise::sequence_lengths::every(4), 2, out, saved),
                       doctest::Contains("6 tokens are not whole sequences of 4"), shardwise::error);
}

TEST_CASE(
    "causal_attention with a sliding window: against a loop over the window; backward against finite "
    "differences; a cached prefill and decode equal it") {
  // Sequences of 7 and 4 rows packed, a window of 3 (each query sees itself and the 2 rows before it), panels of
  // 2 rows forward and 3 backward, so panels start inside and outside the window.
  Index const d = 2, heads = 4, kv_heads = 2, tokens = 11, window = 3;
  shardwise::sequence_lengths const rows{7, 4};
  mat q = random_matrix(tokens, heads * d, 71), k = random_matrix(tokens, kv_heads * d, 72);
  mat v = random_matrix(tokens, kv_heads * d, 73);
  mat const r = random_matrix(tokens, heads * d, 74);
  nn::attention_saved<double> saved;
  mat out = mat::Constant(tokens, heads * d, std::nan(""));
  nn::causal_attention<double>(q, k, v, rows, std::size_t(d), out, saved, 2, std::size_t(window));
  mat expected = mat::Zero(tokens, heads * d);  // softmax over the keys i - window < j <= i of the same sequence
  for (auto [begin, length] : {std::pair<Index, Index>{0, 7}, {7, 4}})
    for (Index h = 0; h < heads; ++h)
      for (Index i = begin; i < begin + length; ++i) {
        Index const kv = h / (heads / kv_heads), from = std::max(begin, i - window + 1);
        std::vector<double> w(std::size_t(i + 1 - from));
        double total = 0;
        for (Index j = from; j <= i; ++j) {
          double dot = 0;
          for (Index c = 0; c < d; ++c) dot += q(i, h * d + c) * k(j, kv * d + c);
          total += w[std::size_t(j - from)] = std::exp(dot / std::sqrt(double(d)));
        }
        for (Index j = from; j <= i; ++j)
          for (Index c = 0; c < d; ++c) expected(i, h * d + c) += w[std::size_t(j - from)] / total * v(j, kv * d + c);
      }
  CHECK(rel_err(out, expected) <= 1e-14);
  mat dq(tokens, heads * d), dk(tokens, kv_heads * d), dv(tokens, kv_heads * d);
  nn::causal_attention_backward<double>(r, q, k, v, saved, dq, dk, dv, 3);
  auto loss = [&] {
    nn::attention_saved<double> again;
    mat y(tokens, heads * d);
    nn::causal_attention<double>(q, k, v, rows, std::size_t(d), y, again, 128, std::size_t(window));
    return weighted_sum(y, r);
  };
  CHECK(rel_err(dq, numeric_grad(q, loss)) <= 1e-8);
  CHECK(rel_err(dk, numeric_grad(k, loss)) <= 1e-8);
  CHECK(rel_err(dv, numeric_grad(v, loss)) <= 1e-8);
  // The first sequence's 7 rows through `cache` as sequence `sequence`: a prefill of 5 and two decode steps, in
  // panels of 2.
  auto const decoded = [&](nn::kv_layer<double>& cache, std::size_t sequence) {
    mat out(7, heads * d);
    for (auto [start, count] : {std::pair<std::size_t, std::size_t>{0, 5}, {5, 1}, {6, 1}}) {
      shardwise::cache_step const step{.entries = {{.sequence = sequence, .start = start, .count = count}},
                                       .capacity = 8};
      auto const at = Index(start), n = Index(count);
      mat o(n, heads * d);
      nn::cached_attention<double>(q.middleRows(at, n), k.middleRows(at, n), v.middleRows(at, n), std::size_t(d), step,
                                   cache, o, 2, std::size_t(window));
      out.middleRows(at, n) = o;
    }
    return out;
  };
  nn::kv_layer<double> cache{mat::Zero(8, kv_heads * d), mat::Zero(8, kv_heads * d)};
  CHECK(rel_err(decoded(cache, 0), expected.topRows(7)) <= 1e-14);
  // A cache that keeps only the window's 3 positions (rolling, position p in row p % 3): the prefill of 5 is longer
  // than the window (its own keys are read before they roll out); and a cache of two sequences, this one in the
  // second.
  for (std::size_t sequence : {0u, 1u}) {
    INFO("sequence " << sequence);
    nn::kv_layer<double> rolling{mat::Zero(Index(3 * (sequence + 1)), kv_heads * d),
                                 mat::Zero(Index(3 * (sequence + 1)), kv_heads * d), 3};
    CHECK(rel_err(decoded(rolling, sequence), expected.topRows(7)) <= 1e-14);
  }
  nn::kv_layer<double> rolling{mat::Zero(3, kv_heads * d), mat::Zero(3, kv_heads * d), 3};
  mat o(1, heads * d);
  shardwise::cache_step const step{.entries = {{.sequence = 0, .start = 0, .count = 1}}, .capacity = 8};
  CHECK_THROWS_WITH_AS(
      nn::cached_attention<double>(q.topRows(1), k.topRows(1), v.topRows(1), std::size_t(d), step, rolling, o, 2, 0),
      doctest::Contains("the layer's cache keeps the last 3 positions of each sequence but the "
                        "attention's window is 0"),
      shardwise::error);
}

TEST_CASE("attention_keys_per_query: the causal half and half a block") {
  CHECK(nn::attention_keys_per_query(4, 2) == 3.0);        // panels: 2 rows x 2 keys, 2 rows x 4 keys
  CHECK(nn::attention_keys_per_query(100, 128) == 100.0);  // one panel: every query meets every key
  CHECK(nn::attention_keys_per_query(8192, 128) == (8192.0 + 128.0) / 2);
  CHECK(nn::attention_keys_per_query(5, 1) == 3.0);  // causal: (5 + 1) / 2
  CHECK(nn::attention_keys_per_query(0, 128) == 0.0);
}

TEST_CASE("causal_attention_backward refuses a saved state that is not from a forward of its inputs") {
  mat const q = random_matrix(8, 8, 1), k = random_matrix(8, 4, 2), v = random_matrix(8, 4, 3);
  mat dq(8, 8), dk(8, 4), dv(8, 4), out(8, 8);
  nn::attention_saved<double> saved;
  CHECK_THROWS_WITH_AS(nn::causal_attention_backward<double>(q, q, k, v, saved, dq, dk, dv),
                       doctest::Contains("`saved` is not from a causal_attention forward of these 8 rows, 8 "
                                         "query and 4 key columns; call causal_attention on them first"),
                       shardwise::error);
  nn::causal_attention<double>(q, k, v, 4, 2, out, saved);
  CHECK_THROWS_WITH_AS(nn::causal_attention_backward<double>(q.topRows(4), q.topRows(4), k.topRows(4), v.topRows(4),
                                                             saved, dq.topRows(4), dk.topRows(4), dv.topRows(4)),
                       doctest::Contains("`saved` is not from a causal_attention forward of these 4 rows"),
                       shardwise::error);
  mat const k_wide = random_matrix(8, 8, 4);  // 4 key-value heads where the forward had 2
  mat dk_wide(8, 8), dv_wide(8, 8);
  CHECK_THROWS_WITH_AS(nn::causal_attention_backward<double>(q, q, k_wide, k_wide, saved, dq, dk_wide, dv_wide),
                       doctest::Contains("`saved` is not from a causal_attention forward of these 8 rows, 8 query and "
                                         "8 key columns"),
                       shardwise::error);
  CHECK_THROWS_WITH_AS(nn::causal_attention<double>(q, k, v, 4, 2, out, saved, 0),
                       doctest::Contains("causal_attention: block_rows is 0; give it at least one query row per panel"),
                       shardwise::error);
}

TEST_CASE("float agrees with double") {
  Index const n = 6, d = 8, out = 5;
  mat const x = random_matrix(n, d, 60, -3.0, 3.0), w = random_matrix(out, d, 61), r_lin = random_matrix(n, out, 62),
            r_norm = random_matrix(n, d, 63);
  vec const b = random_vector(out, 64);
  std::vector<std::int64_t> const ids = {2, 3, 7, 1, -5, 3, 9};
  std::vector<std::int64_t> const targets = {0, 7, -100, 3, 5, 5};
  auto const in_double = run_all<double>(x, w, b, r_lin, r_norm, ids, targets);
  auto const in_float = run_all<float>(x, w, b, r_lin, r_norm, ids, targets);
  REQUIRE(in_double.size() == in_float.size());
  for (std::size_t k = 0; k < in_double.size(); ++k) {
    CAPTURE(k);
    CHECK(rel_err(in_float[k], in_double[k]) < 1e-5);
  }
}
