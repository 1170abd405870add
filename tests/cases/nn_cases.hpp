#pragma once
// Tensor parallelism against the unsharded run of the same code: every style, the feed-forward and attention
// blocks, sequence-parallel norms, both embedding styles, loss parallel and every activation move. Forward output,
// input gradient and every parameter gradient must match (fp64: 1e-12, fp32: 1e-5, relative to the largest entry).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <shardwise/mesh/counting.hpp>
#include <vector>

#include "../../examples/blocks.hpp"
#include "../support/materialized_attention.hpp"

namespace nn_cases {

namespace sw = shardwise;
template <class T>
using M = sw::nn::matrix<T>;

template <class T>
double tolerance() {
  return std::is_same_v<T, double> ? 1e-12 : 1e-5;
}

template <class T>
M<T> random_matrix(Eigen::Index rows, Eigen::Index cols, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  M<T> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(u(rng));
  return m;
}

template <class A, class B>
double relative_error(A const& got, B const& expected) {
  if (got.rows() != expected.rows() || got.cols() != expected.cols()) return 1e300;
  if (expected.size() == 0) return 0;  // an empty piece (more ranks than rows or columns)
  double const scale = std::max(1e-30, static_cast<double>(expected.cwiseAbs().maxCoeff()));
  return static_cast<double>((got - expected).cwiseAbs().maxCoeff()) / scale;
}

#define NN_CHECK_CLOSE(got, expected, what)                  \
  do {                                                       \
    double const error_ = relative_error((got), (expected)); \
    INFO(what << ": relative error " << error_);             \
    CHECK(error_ <= tolerance<T>());                         \
  } while (0)

/// This rank's part of a full activation in layout P, cut with Eigen blocks (not with shardwise).
template <class P, class T>
M<T> part_of(M<T> const& full, int rank, int n) {
  using N = sw::detail::normalize_2d_t<P>;
  if constexpr (std::is_same_v<N, sw::Shard<0>>) {
    auto const rows = full.rows() / n;
    return full.middleRows(rank * rows, rows);
  } else if constexpr (std::is_same_v<N, sw::Shard<1>>) {
    auto const cols = full.cols() / n;
    return full.middleCols(rank * cols, cols);
  } else {
    return full;
  }
}

/// The full activation from every rank's part in layout P.
template <class P, class Mesh, class T>
M<T> whole_of(Mesh const& tp, M<T> const& local) {
  using N = sw::detail::normalize_2d_t<P>;
  M<T> all;
  if constexpr (std::is_same_v<N, sw::Shard<0>>)
    sw::all_gather(tp, local, all, 0);
  else if constexpr (std::is_same_v<N, sw::Shard<1>>)
    sw::all_gather(tp, local, all, 1);
  else
    all = local;
  return all;
}
template <class P, class Mesh, class T>
sw::nn::vector<T> whole_of(Mesh const& tp, sw::nn::vector<T> const& local) {
  M<T> as_row = local.transpose();
  return whole_of<std::conditional_t<std::is_same_v<P, sw::Shard<0>>, sw::Shard<1>, P>>(tp, as_row).transpose();
}

template <class T, class Plan>
struct OneLinear {
  sw::Linear<T, sw::layer_at<Plan, "lin">> lin;
  SHARDWISE_CHILDREN(lin)
  OneLinear(std::size_t in, std::size_t out) : lin(in, out, 17) {}
};

template <class T, class Style, class Mesh>
void check_linear_style(Mesh const& tp, char const* name) {
  INFO("Linear with " << name);
  int const n = tp.size(), r = tp.rank();
  OneLinear<T, sw::serial_plan> serial(8, 12);
  OneLinear<T, sw::plan<sw::at<"lin", Style>>> sharded(8, 12);
  sw::parallelize(sharded, tp);
  using L = decltype(sharded.lin);
  using In = typename L::input_layout;
  using Out = typename L::output_layout;
  M<T> const x = random_matrix<T>(8, 8, 1), dy = random_matrix<T>(8, 12, 2);

  auto const y0 = serial.lin(x);
  auto const dx0 = serial.lin.backward(sw::Activation<T>{dy});
  auto const y = sharded.lin(sw::Activation<T, In>{part_of<In>(x, r, n)});
  NN_CHECK_CLOSE(whole_of<Out>(tp, y.local), y0.local, "output");
  auto const dx = sharded.lin.backward(sw::Activation<T, Out>{part_of<Out>(dy, r, n)});
  // ColwiseParallel on a replicated input leaves its input gradient Partial<Sum>: reduced by whoever needs it.
  using DX = typename std::remove_cvref_t<decltype(dx)>::placement;
  static_assert(std::is_same_v<DX, sw::Partial<sw::Sum>> ==
                (sw::is_colwise_v<Style> && std::is_same_v<In, sw::Replicate>));
  NN_CHECK_CLOSE(whole_of<In>(tp, sw::redistribute<In>(tp, dx).local), dx0.local, "input gradient");
  NN_CHECK_CLOSE(whole_of<typename L::weight_grad_placement>(tp, sharded.lin.weight_grad), serial.lin.weight_grad,
                 "weight gradient");
  NN_CHECK_CLOSE(whole_of<typename L::bias_grad_placement>(tp, sharded.lin.bias_grad), serial.lin.bias_grad,
                 "bias gradient");
}

template <class T, class Plan>
struct OneEmbedding {
  sw::Embedding<T, sw::layer_at<Plan, "tok">> tok;
  SHARDWISE_CHILDREN(tok)
  OneEmbedding() : tok(12, 8, 5) {}
};

template <class T, class Style, class Mesh>
void check_embedding_style(Mesh const& tp, char const* name) {
  INFO("Embedding with " << name);
  int const n = tp.size(), r = tp.rank();
  OneEmbedding<T, sw::serial_plan> serial;
  OneEmbedding<T, sw::plan<sw::at<"tok", Style>>> sharded;
  sw::parallelize(sharded, tp);
  using Out = typename decltype(sharded.tok)::output_layout;
  std::vector<std::int64_t> const ids{3, 11, 0, 7, 3, 5, 9, 1};
  M<T> const dy = random_matrix<T>(8, 8, 3);
  auto const y0 = serial.tok(ids);
  serial.tok.backward(sw::Activation<T>{dy});
  auto const y = sharded.tok(ids);
  NN_CHECK_CLOSE(whole_of<Out>(tp, y.local), y0.local, "output");
  sharded.tok.backward(sw::Activation<T, Out>{part_of<Out>(dy, r, n)});
  using G = typename decltype(sharded.tok)::grad_placement;
  NN_CHECK_CLOSE(whole_of<G>(tp, sharded.tok.weight_grad), serial.tok.weight_grad, "table gradient");
}

template <class T, class Plan, template <class, class> class Norm>
struct OneNorm {
  Norm<T, sw::layer_at<Plan, "norm">> norm;
  SHARDWISE_CHILDREN(norm)
  OneNorm() : norm(8) {
    for (Eigen::Index i = 0; i < norm.weight.size(); ++i) norm.weight(i) = T(1) + T(0.1) * T(i);
  }
};

template <class T, template <class, class> class Norm, class Mesh>
void check_sequence_parallel_norm(Mesh const& tp, char const* name) {
  INFO(name << " with SequenceParallel");
  int const n = tp.size(), r = tp.rank();
  OneNorm<T, sw::serial_plan, Norm> serial;
  OneNorm<T, sw::plan<sw::at<"norm", sw::SequenceParallel<>>>, Norm> sharded;
  sw::parallelize(sharded, tp);
  M<T> const x = random_matrix<T>(8, 8, 7), dy = random_matrix<T>(8, 8, 8);
  auto const y0 = serial.norm(x);
  auto const dx0 = serial.norm.backward(sw::Activation<T>{dy});
  auto const y = sharded.norm(sw::Activation<T, sw::Shard<0>>{part_of<sw::Shard<0>>(x, r, n)});
  NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, y.local), y0.local, "output");
  auto const dx = sharded.norm.backward(sw::Activation<T, sw::Shard<0>>{part_of<sw::Shard<0>>(dy, r, n)});
  NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, dx.local), dx0.local, "input gradient");
  // The weight gradient is a partial sum over this rank's tokens until reduced; its type says so.
  auto const partial = sharded.norm.parameters();
  static_assert(sw::is_partial_v<typename std::tuple_element_t<0, decltype(partial)>::grad_placement>);
  auto const reduced = sw::reduce(partial);
  static_assert(!sw::is_partial_v<typename std::tuple_element_t<0, decltype(reduced)>::grad_placement>);
  NN_CHECK_CLOSE(*std::get<0>(reduced).grad, serial.norm.weight_grad, "weight gradient, reduced");
}

template <class T, class Mesh>
void check_loss_parallel(Mesh const& tp) {
  INFO("loss parallel");
  int const n = tp.size(), r = tp.rank();
  M<T> const logits = random_matrix<T>(8, 12, 9) * T(3);
  std::vector<std::int64_t> const targets{1, 11, -100, 4, 0, 7, 7, 10};
  auto const serial = sw::cross_entropy(sw::Activation<T>{logits}, targets);
  auto const sharded =
      sw::loss_parallel(tp, sw::Activation<T, sw::Shard<-1>>{part_of<sw::Shard<1>>(logits, r, n)}, targets);
  CHECK(std::abs(static_cast<double>(sharded.loss - serial.loss)) <=
        tolerance<T>() * std::max(1.0, std::abs(static_cast<double>(serial.loss))));
  NN_CHECK_CLOSE(whole_of<sw::Shard<1>>(tp, sharded.dlogits.local), serial.dlogits.local, "logit gradient");

  // Vocabulary padding: only the first 10 of the 12 columns are classes. The padding's gradient is exactly zero
  // on both paths, and the real columns match the plain loss over those 10 columns alone.
  std::vector<std::int64_t> const in_classes{1, 9, -100, 4, 0, 7, 7, 3};
  auto const plain = sw::cross_entropy(sw::Activation<T>{M<T>(logits.leftCols(10))}, in_classes);
  auto const serial_padded = sw::cross_entropy(sw::Activation<T>{logits}, in_classes, -100, 10);
  auto const sharded_padded = sw::loss_parallel(
      tp, sw::Activation<T, sw::Shard<-1>>{part_of<sw::Shard<1>>(logits, r, n)}, in_classes, -100, 10);
  M<T> const whole_padded = whole_of<sw::Shard<1>>(tp, sharded_padded.dlogits.local);
  CHECK(serial_padded.dlogits.local.rightCols(2).cwiseAbs().maxCoeff() == T(0));
  CHECK(whole_padded.rightCols(2).cwiseAbs().maxCoeff() == T(0));
  CHECK(whole_padded.row(2).cwiseAbs().maxCoeff() == T(0));  // the ignored target's row
  NN_CHECK_CLOSE(M<T>(serial_padded.dlogits.local.leftCols(10)), plain.dlogits.local, "padded logit gradient");
  NN_CHECK_CLOSE(M<T>(whole_padded.leftCols(10)), plain.dlogits.local, "padded logit gradient, loss parallel");
  CHECK(std::abs(static_cast<double>(sharded_padded.loss - plain.loss)) <=
        tolerance<T>() * std::max(1.0, std::abs(static_cast<double>(plain.loss))));

  // Logits given as a temporary: the gradient is written into their storage, with the same bits.
  for (std::int64_t classes : {std::int64_t{-1}, std::int64_t{10}}) {
    CAPTURE(classes);
    sw::Activation<T, sw::Shard<-1>> temporary{part_of<sw::Shard<1>>(logits, r, n)};
    T const* storage = temporary.local.data();
    auto const lvalue = sw::loss_parallel(tp, temporary, in_classes, -100, classes);
    auto const rvalue = sw::loss_parallel(tp, std::move(temporary), in_classes, -100, classes);
    CHECK(rvalue.dlogits.local.data() == storage);
    CHECK(rvalue.dlogits.local == lvalue.dlogits.local);
    CHECK(rvalue.loss == lvalue.loss);
    sw::Activation<T> replicated{logits};
    T const* replicated_storage = replicated.local.data();
    auto const serial_lvalue = sw::cross_entropy(replicated, in_classes, -100, classes);
    auto const serial_rvalue = sw::cross_entropy(std::move(replicated), in_classes, -100, classes);
    CHECK(serial_rvalue.dlogits.local.data() == replicated_storage);
    CHECK(serial_rvalue.dlogits.local == serial_lvalue.dlogits.local);
    CHECK(serial_rvalue.loss == serial_lvalue.loss);
  }
  // Every target ignored: zero loss and an all-zero gradient in the temporary's storage.
  std::vector<std::int64_t> const none(8, -100);
  auto const ignored =
      sw::loss_parallel(tp, sw::Activation<T, sw::Shard<-1>>{part_of<sw::Shard<1>>(logits, r, n)}, none);
  CHECK(ignored.loss == T(0));
  CHECK(ignored.dlogits.local.cwiseAbs().maxCoeff() == T(0));
  auto const ignored_serial = sw::cross_entropy(sw::Activation<T>{logits}, none);
  CHECK(ignored_serial.dlogits.local.cwiseAbs().maxCoeff() == T(0));
  // Only 3 classes: at 4 ranks, ranks 1-3 hold nothing but padding.
  std::vector<std::int64_t> const three{1, 2, -100, 0, 0, 2, 1, 1};
  auto const few =
      sw::loss_parallel(tp, sw::Activation<T, sw::Shard<-1>>{part_of<sw::Shard<1>>(logits, r, n)}, three, -100, 3);
  auto const few_plain = sw::cross_entropy(sw::Activation<T>{M<T>(logits.leftCols(3))}, three);
  M<T> const few_whole = whole_of<sw::Shard<1>>(tp, few.dlogits.local);
  NN_CHECK_CLOSE(M<T>(few_whole.leftCols(3)), few_plain.dlogits.local, "gradient over 3 classes");
  CHECK(few_whole.rightCols(9).cwiseAbs().maxCoeff() == T(0));
  CHECK(std::abs(static_cast<double>(few.loss - few_plain.loss)) <=
        tolerance<T>() * std::max(1.0, std::abs(static_cast<double>(few_plain.loss))));
  // A bad target throws before a temporary's logits are taken: the caller keeps them.
  std::vector<std::int64_t> const bad{1, 2, 3, 4, 5, 6, 7, 99};
  sw::Activation<T, sw::Shard<-1>> kept{part_of<sw::Shard<1>>(logits, r, n)};
  M<T> const kept_copy = kept.local;
  CHECK_THROWS_AS((void)sw::loss_parallel(tp, std::move(kept), bad), sw::error);
  CHECK(kept.local == kept_copy);
  sw::Activation<T> kept_serial{logits};
  CHECK_THROWS_AS((void)sw::cross_entropy(std::move(kept_serial), bad), sw::error);
  CHECK(kept_serial.local == logits);
}

/// A block with a sequence-parallel norm in front of the feed-forward, as torchtitan lays out Llama; the
/// feed-forward's own plan entry (PrepareModuleInput) is applied by sw::forward / sw::backward.
template <class T, class Plan>
struct NormFeedForward {
  sw::RMSNorm<T, sw::layer_at<Plan, "norm">> norm;
  blocks::FeedForward<T, sw::subplan<Plan, "feed_forward">> feed_forward;
  SHARDWISE_CHILDREN(norm, feed_forward)
  NormFeedForward() : norm(8), feed_forward(8, 16, 30) {}
};

using feed_forward_plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w3", sw::ColwiseParallel<>>,
                                   sw::at<"w2", sw::RowwiseParallel<>>>;
using sequence_parallel_plan =
    sw::plan<sw::at<"norm", sw::SequenceParallel<>>,
             sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
             sw::at<"feed_forward.w1", sw::ColwiseParallel<>>, sw::at<"feed_forward.w3", sw::ColwiseParallel<>>,
             sw::at<"feed_forward.w2", sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>>;
using attention_plan = sw::plan<sw::at<"wq", sw::ColwiseParallel<>>, sw::at<"wk", sw::ColwiseParallel<>>,
                                sw::at<"wv", sw::ColwiseParallel<>>, sw::at<"wo", sw::RowwiseParallel<>>>;

/// blocks::Attention (dim 8, 4 heads) sharded over tp against unsharded on x: output, input gradient and every
/// parameter gradient.
template <class T, class Mesh>
void check_attention_module(Mesh const& tp, M<T> const& x, M<T> const& dy, std::size_t sequence) {
  blocks::Attention<T> serial(8, 4, sequence, 40);
  blocks::Attention<T, attention_plan> sharded(8, 4, sequence, 40);
  sw::parallelize(sharded, tp);
  auto const y0 = serial.forward(x);
  auto const dx0 = serial.backward(sw::Activation<T>{dy});
  NN_CHECK_CLOSE(sharded.forward(x).local, y0.local, "output");
  NN_CHECK_CLOSE(sw::redistribute<sw::Replicate>(tp, sharded.backward(sw::Activation<T>{dy})).local, dx0.local,
                 "input gradient");
  NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, sharded.wq.weight_grad), serial.wq.weight_grad, "wq gradient");
  NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, sharded.wk.weight_grad), serial.wk.weight_grad, "wk gradient");
  NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, sharded.wv.bias_grad), serial.wv.bias_grad, "wv bias gradient");
  NN_CHECK_CLOSE(whole_of<sw::Shard<1>>(tp, sharded.wo.weight_grad), serial.wo.weight_grad, "wo gradient");
  NN_CHECK_CLOSE(sharded.wo.bias_grad, serial.wo.bias_grad, "wo bias gradient");
}

template <class T, class Mesh>
void check_blocks(Mesh const& tp) {
  int const n = tp.size(), r = tp.rank();
  M<T> const x = random_matrix<T>(8, 8, 11), dy = random_matrix<T>(8, 8, 12);
  {
    INFO("feed-forward: w1, w3 Colwise, w2 Rowwise");
    blocks::FeedForward<T> serial(8, 16, 30);
    blocks::FeedForward<T, feed_forward_plan> sharded(8, 16, 30);
    sw::parallelize(sharded, tp);
    auto const y0 = serial.forward(x);
    auto const dx0 = serial.backward(sw::Activation<T>{dy});
    auto const y = sharded.forward(x);
    NN_CHECK_CLOSE(y.local, y0.local, "output");
    auto const dx = sharded.backward(sw::Activation<T>{dy});  // Partial<Sum>: w1's and w3's parts, not reduced
    NN_CHECK_CLOSE(sw::redistribute<sw::Replicate>(tp, dx).local, dx0.local, "input gradient");
    NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, sharded.w1.weight_grad), serial.w1.weight_grad, "w1 gradient");
    NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, sharded.w3.weight_grad), serial.w3.weight_grad, "w3 gradient");
    NN_CHECK_CLOSE(whole_of<sw::Shard<1>>(tp, sharded.w2.weight_grad), serial.w2.weight_grad, "w2 gradient");
  }
  {
    INFO("sequence parallel: SequenceParallel norm, PrepareModuleInput, w2 Rowwise to Shard<0>");
    NormFeedForward<T, sw::serial_plan> serial;
    NormFeedForward<T, sequence_parallel_plan> sharded;
    sw::parallelize(sharded, tp);
    auto const h0 = serial.norm(x);
    auto const y0 = serial.feed_forward.forward(h0);
    auto const dx0 = serial.norm.backward(serial.feed_forward.backward(sw::Activation<T>{dy}));
    auto const h = sharded.norm(sw::Activation<T, sw::Shard<0>>{part_of<sw::Shard<0>>(x, r, n)});
    auto const y = sw::forward(sharded.feed_forward, h);
    static_assert(std::is_same_v<typename std::remove_cvref_t<decltype(y)>::placement, sw::Shard<0>>);
    NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, y.local), y0.local, "output");
    auto const dx = sharded.norm.backward(
        sw::backward(sharded.feed_forward, sw::Activation<T, sw::Shard<0>>{part_of<sw::Shard<0>>(dy, r, n)}));
    NN_CHECK_CLOSE(whole_of<sw::Shard<0>>(tp, dx.local), dx0.local, "input gradient");
    NN_CHECK_CLOSE(*std::get<0>(sw::reduce(sharded.norm.parameters())).grad, serial.norm.weight_grad, "norm gradient");
    NN_CHECK_CLOSE(whole_of<sw::Shard<1>>(tp, sharded.feed_forward.w2.weight_grad), serial.feed_forward.w2.weight_grad,
                   "w2 gradient");
  }
  {
    INFO("attention: wq, wk, wv Colwise (heads split), wo Rowwise");
    check_attention_module<T>(tp, x, dy, 4);  // 8 tokens: two sequences of 4
  }
  {
    INFO("attention over a batch: each sequence attends to itself only, as if run alone");
    blocks::Attention<T> batch(8, 4, 4, 40), alone(8, 4, 4, 40);
    auto const y = batch.forward(x).local;
    NN_CHECK_CLOSE(M<T>(y.topRows(4)), alone.forward(M<T>(x.topRows(4))).local, "first sequence");
    NN_CHECK_CLOSE(M<T>(y.bottomRows(4)), alone.forward(M<T>(x.bottomRows(4))).local, "second sequence");
    CHECK_THROWS_WITH_AS(
        batch.forward(M<T>(x.topRows(6))),
        "shardwise::nn::causal_attention: 6 tokens are not whole sequences of 4; give it rows of whole "
        "sequences",
        sw::error);
  }
  {
    // Two sequences of 160 tokens: panels of 128 and 32 rows under the default block. Each rank's heads through
    // the blocked kernel, against the materialized attention over all heads (its columns); then the module
    // sharded against unsharded.
    INFO("blocked attention over sequences the block does not divide, 8 query heads reading 4 key-value heads");
    Eigen::Index const s = 160, d = 4, heads = 8, kv_heads = 4, tokens = 2 * s;
    M<T> const q = random_matrix<T>(tokens, heads * d, 51), k = random_matrix<T>(tokens, kv_heads * d, 52),
               v = random_matrix<T>(tokens, kv_heads * d, 53), dout = random_matrix<T>(tokens, heads * d, 54);
    ref::materialized_attention<T> reference;
    M<T> out_ref, dq_ref, dk_ref, dv_ref;
    reference.forward(q, k, v, s, d, out_ref);
    reference.backward(dout, q, k, v, dq_ref, dk_ref, dv_ref);
    Eigen::Index const mine = heads / n * d, mine_kv = kv_heads / n * d;  // this rank's columns
    auto cols = [&](M<T> const& m, Eigen::Index width) { return M<T>(m.middleCols(r * width, width)); };
    sw::nn::attention_saved<T> saved;
    M<T> out(tokens, mine), dq(tokens, mine), dk(tokens, mine_kv), dv(tokens, mine_kv);
    sw::nn::causal_attention<T>(cols(q, mine), cols(k, mine_kv), cols(v, mine_kv), s, d, out, saved);
    sw::nn::causal_attention_backward<T>(cols(dout, mine), cols(q, mine), cols(k, mine_kv), cols(v, mine_kv), saved, dq,
                                         dk, dv);
    NN_CHECK_CLOSE(out, cols(out_ref, mine), "this rank's heads' output");
    NN_CHECK_CLOSE(dq, cols(dq_ref, mine), "dq");
    NN_CHECK_CLOSE(dk, cols(dk_ref, mine_kv), "dk");
    NN_CHECK_CLOSE(dv, cols(dv_ref, mine_kv), "dv");

    check_attention_module<T>(tp, random_matrix<T>(tokens, 8, 55), random_matrix<T>(tokens, 8, 56), s);
  }
  if (n == 4) {
    INFO("a head count the tp size does not divide is refused at parallelize, on every rank");
    blocks::Attention<T, attention_plan> two_heads(8, 2, 4, 40);
    CHECK_THROWS_WITH_AS(sw::parallelize(two_heads, tp),
                         "shardwise::parallelize at \"\": 2 heads do not divide over 4 ranks; choose sizes the tp size "
                         "divides",
                         sw::error);
    OneLinear<T, sw::plan<sw::at<"lin", sw::ColwiseParallel<>>>> odd(8, 6);
    CHECK_THROWS_WITH_AS(sw::parallelize(odd, tp),
                         "shardwise::ColwiseParallel at \"lin\": 6 output features do not divide over 4 ranks of mesh "
                         "axis \"tp\"; choose sizes the tp size divides, or pad them with pad_outputs_for_tp()",
                         sw::error);
  }
}

/// torch.chunk's piece `rank` of `n` along dim (ceil(total / n) each, the last ranks the rest), cut with Eigen
/// blocks: the reference for uneven activations.
template <class T>
M<T> chunk_of(M<T> const& full, int dim, int rank, int n) {
  Eigen::Index const total = dim == 0 ? full.rows() : full.cols();
  Eigen::Index const piece = (total + n - 1) / n;
  Eigen::Index const first = std::min<Eigen::Index>(rank * piece, total);
  Eigen::Index const size = std::min<Eigen::Index>(piece, total - first);
  return dim == 0 ? M<T>(full.middleRows(first, size)) : M<T>(full.middleCols(first, size));
}
template <class P, class T>
M<T> chunk_in(M<T> const& full, int rank, int n) {
  using N = sw::detail::normalize_2d_t<P>;
  if constexpr (sw::is_shard_v<N>)
    return chunk_of(full, N::dim, rank, n);
  else
    return full;
}

/// One activation move, From to To, on a [7, 5] activation (sizes no tp size above 1 divides): this rank's
/// result equals its piece of the unsharded activation, and the layers' collective count equals what the cost
/// model says the move transfers (sw::redistribute and module boundaries run the same rule).
template <class T, class From, class To, class Mesh>
void check_one_move(Mesh const& tp, sw::transfer_log& log, char const* what) {
  INFO("redistribute " << what);
  int const n = tp.size(), r = tp.rank();
  M<T> whole = random_matrix<T>(7, 5, 90);
  M<T> local;
  if constexpr (sw::is_partial_v<From>) {  // each rank a summand; the whole is their sum
    whole.setZero();
    for (int k = 0; k < n; ++k) {
      M<T> const summand = random_matrix<T>(7, 5, 91 + static_cast<std::uint64_t>(k));
      whole += summand;
      if (k == r) local = summand;
    }
  } else {
    local = chunk_in<From>(whole, r, n);
  }
  log.clear();
  auto const moved = sw::redistribute<To>(tp, sw::Activation<T, From>{local});
  auto const c = sw::count_of(log.entries());
  NN_CHECK_CLOSE(moved.local, chunk_in<To>(whole, r, n), "values");
  sw::transfer_list<> predicted;
  sw::cost_inputs const s{.tokens = 7, .tp = static_cast<std::size_t>(n), .tp_rank = static_cast<std::size_t>(r)};
  sw::detail::add_redistribute<From, To>(predicted, 7, 5, sizeof(T), s);
  CHECK(c.all_gather == predicted.calls(sw::transfer_kind::all_gather));
  CHECK(c.all_gather_bytes == predicted.bytes(sw::transfer_kind::all_gather));
  CHECK(c.all_to_all == predicted.calls(sw::transfer_kind::all_to_all));
  CHECK(c.all_to_all_bytes == predicted.bytes(sw::transfer_kind::all_to_all));
  CHECK(c.all_reduce == predicted.calls(sw::transfer_kind::all_reduce));
  CHECK(c.all_reduce_bytes == predicted.bytes(sw::transfer_kind::all_reduce));
  CHECK(c.reduce_scatter == predicted.calls(sw::transfer_kind::reduce_scatter));
  CHECK(c.reduce_scatter_bytes == predicted.bytes(sw::transfer_kind::reduce_scatter));
}

template <class T, class World>
void check_moves(World const& world) {
  auto counted = sw::counting(world);
  auto const tp = sw::make_mesh<"tp">(counted, {world.size()});
  auto& log = counted.log();
  using R = sw::Replicate;
  using S0 = sw::Shard<0>;
  using S1 = sw::Shard<-1>;
  using P = sw::Partial<sw::Sum>;
  check_one_move<T, R, R>(tp, log, "Replicate -> Replicate");
  check_one_move<T, R, S0>(tp, log, "Replicate -> Shard<0>");
  check_one_move<T, R, S1>(tp, log, "Replicate -> Shard<-1>");
  check_one_move<T, S0, R>(tp, log, "Shard<0> -> Replicate");
  check_one_move<T, S0, S1>(tp, log, "Shard<0> -> Shard<-1>");
  check_one_move<T, S1, R>(tp, log, "Shard<-1> -> Replicate");
  check_one_move<T, S1, S0>(tp, log, "Shard<-1> -> Shard<0>");
  check_one_move<T, P, R>(tp, log, "Partial -> Replicate");
  check_one_move<T, P, S0>(tp, log, "Partial -> Shard<0>");
  check_one_move<T, P, S1>(tp, log, "Partial -> Shard<-1>");
  // A Shard<0> <-> Shard<-1> move is one all-to-all (DTensor's rule), not a gather and a slice.
  sw::transfer_list<> list;
  sw::detail::add_redistribute<S0, S1>(list, 8, 8, sizeof(T), {.tokens = 8, .tp = 2});
  CHECK(list.calls() == 1);
  CHECK(list.calls(sw::transfer_kind::all_to_all) == 1);
}

template <class T, class World>
void check_all(World const& world) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  check_linear_style<T, sw::ColwiseParallel<>>(tp, "ColwiseParallel<Replicate, Shard<-1>>");
  check_linear_style<T, sw::ColwiseParallel<sw::Replicate, sw::Replicate>>(tp, "ColwiseParallel<Replicate, Replicate>");
  check_linear_style<T, sw::ColwiseParallel<sw::Shard<0>>>(tp, "ColwiseParallel<Shard<0>, Shard<-1>>");
  check_linear_style<T, sw::RowwiseParallel<>>(tp, "RowwiseParallel<Shard<-1>, Replicate>");
  check_linear_style<T, sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>(tp, "RowwiseParallel<Shard<-1>, Shard<0>>");
  check_linear_style<T, sw::RowwiseParallel<sw::Replicate, sw::Replicate>>(tp, "RowwiseParallel<Replicate, Replicate>");
  check_embedding_style<T, sw::RowwiseParallel<sw::Replicate, sw::Replicate>>(tp, "RowwiseParallel (vocabulary)");
  check_embedding_style<T, sw::RowwiseParallel<sw::Replicate, sw::Shard<0>>>(tp, "RowwiseParallel to Shard<0>");
  check_embedding_style<T, sw::ColwiseParallel<>>(tp, "ColwiseParallel");
  check_embedding_style<T, sw::ColwiseParallel<sw::Replicate, sw::Replicate>>(tp, "ColwiseParallel to Replicate");
  check_sequence_parallel_norm<T, sw::LayerNorm>(tp, "LayerNorm");
  check_sequence_parallel_norm<T, sw::RMSNorm>(tp, "RMSNorm");
  check_loss_parallel<T>(tp);
  check_blocks<T>(tp);
  check_moves<T>(world);
}

}  // namespace nn_cases
