// The C++ half of the outside check against PyTorch (tp_reference.py holds the other half, which shares no
// code with this): the MLP, the attention block and a sequence-parallel norm + MLP, sharded at TP 2 on the
// thread mesh, each rank's local outputs and local parameter gradients written to .npy files; and the
// unsharded forward and backward of Linear, Embedding, LayerNorm, RMSNorm and cross-entropy. Inputs and
// weights are written too, so PyTorch starts from exactly the same numbers. With "moe", the mixture-of-experts
// feed-forward only, for moe_reference.py (transformers' Mixtral and Qwen3-MoE sparse blocks).
#include <array>
#include <cstdio>
#include <filesystem>
#include <random>
#include <shardwise/models/moe.hpp>
#include <shardwise/nn.hpp>
#include <shardwise/shardwise.hpp>
#include <string>
#include <string_view>

#include "../../examples/blocks.hpp"
#include "npy.hpp"

namespace sw = shardwise;
using T = double;
using Matrix = sw::nn::matrix<T>;
namespace fs = std::filesystem;

Matrix random_matrix(long rows, long cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<double> normal;
  Matrix m(rows, cols);
  for (long i = 0; i < m.size(); ++i) m.data()[i] = normal(rng);
  return m;
}

template <class T2, class Plan>
struct NormFeedForward {
  sw::RMSNorm<T2, sw::layer_at<Plan, "norm">> norm;
  blocks::FeedForward<T2, sw::subplan<Plan, "feed_forward">> feed_forward;
  SHARDWISE_CHILDREN(norm, feed_forward)
  NormFeedForward(std::size_t dim, std::size_t hidden) : norm(dim, 1e-6), feed_forward(dim, hidden, 30) {
    for (long i = 0; i < norm.weight.size(); ++i) norm.weight(i) = 1.0 + 0.05 * double(i);
  }
};

using mlp_plan = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w3", sw::ColwiseParallel<>>,
                          sw::at<"w2", sw::RowwiseParallel<>>>;
using attention_plan = sw::plan<sw::at<"wq", sw::ColwiseParallel<>>, sw::at<"wk", sw::ColwiseParallel<>>,
                                sw::at<"wv", sw::ColwiseParallel<>>, sw::at<"wo", sw::RowwiseParallel<>>>;
using sp_plan =
    sw::plan<sw::at<"norm", sw::SequenceParallel<>>,
             sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
             sw::at<"feed_forward.w1", sw::ColwiseParallel<>>, sw::at<"feed_forward.w3", sw::ColwiseParallel<>>,
             sw::at<"feed_forward.w2", sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>>;

/// The mixture-of-experts feed-forward (moe_reference.py compares it with transformers' sparse blocks): inputs,
/// the router and the experts stacked as transformers keeps them (gate_up [experts * 2 hidden, dim], w1's rows
/// first; down [experts * dim, hidden]), the output, the load-balancing loss and every gradient of
/// sum(y * dy) + router_aux_loss_coef * aux.
namespace models = shardwise::models;

/// The blocks' config: 8 experts of width 12 on dim 16, top-2, and what each family changes.
models::MoeConfig moe_config(bool normalize, double aux_coef, std::size_t shared = 0) {
  models::MoeConfig c;
  c.dim = 16, c.expert_hidden = 12, c.experts = 8, c.top_k = 2, c.normalize_top_k = normalize;
  c.router_aux_loss_coef = aux_coef, c.shared_expert_hidden = shared;
  return c;
}

/// A block's weights and their gradients, in transformers' layout, into `dir`.
void write_block(fs::path const& dir, models::MoeFeedForward<T> const& moe) {
  auto stacked = [&](auto const& weight_of) {  // the experts' matrices one under the other
    Matrix const first = weight_of(moe.experts[0]);
    Matrix m(first.rows() * long(moe.experts.size()), first.cols());
    for (std::size_t e = 0; e < moe.experts.size(); ++e)
      m.middleRows(long(e) * first.rows(), first.rows()) = weight_of(moe.experts[e]);
    return m;
  };
  auto pair = [](Matrix const& gate, Matrix const& up) {  // gate_up_proj: the gate's rows, then the up's
    Matrix both(gate.rows() * 2, gate.cols());
    both << gate, up;
    return both;
  };
  fs::create_directories(dir);
  auto write = [&](std::string const& file, auto const& m) { npy::write(dir / (file + ".npy"), m); };
  write("gate", moe.gate.weight), write("gate_grad", moe.gate.weight_grad);
  write("gate_up", stacked([&](auto const& e) { return pair(e.w1.weight, e.w3.weight); }));
  write("gate_up_grad", stacked([&](auto const& e) { return pair(e.w1.weight_grad, e.w3.weight_grad); }));
  write("down", stacked([](auto const& e) -> Matrix { return e.w2.weight; }));
  write("down_grad", stacked([](auto const& e) -> Matrix { return e.w2.weight_grad; }));
  if (moe.config().router == models::moe_router::sigmoid) write("bias", moe.score_correction_bias);
  auto write_layer = [&](std::string const& file, auto const& layer) {
    write(file, layer.weight);
    write(file + "_grad", layer.weight_grad);
  };
  if (moe.shared_expert) {
    write_layer("shared_gate_proj", moe.shared_expert->w1);
    write_layer("shared_up_proj", moe.shared_expert->w3);
    write_layer("shared_down_proj", moe.shared_expert->w2);
  }
  if (moe.shared_expert_gate) write_layer("shared_expert_gate", *moe.shared_expert_gate);
}

/// One block: its inputs, output, load-balancing loss and input gradient, then its weights and gradients.
void dump_moe(fs::path const& out, std::string const& name, models::MoeConfig const& c) {
  models::MoeFeedForward<T> moe(c, 40);
  if (c.router == models::moe_router::sigmoid) moe.score_correction_bias = random_matrix(8, 1, 43).col(0) * 0.2;
  Matrix const x = random_matrix(24, 16, 41), dy = random_matrix(24, 16, 42);
  fs::create_directories(out / name);
  npy::write(out / name / "x.npy", x), npy::write(out / name / "dy.npy", dy);
  npy::write(out / name / "y.npy", moe.forward(x).local);
  npy::write(out / name / "aux.npy", Eigen::VectorXd::Constant(1, moe.aux_loss()));
  sw::zero_grad(moe);
  npy::write(out / name / "dx.npy", moe.backward(dy).local);
  write_block(out / name, moe);
}

/// Two Mixtral blocks in a row, their load-balancing loss pooled (models::load_balancing_loss) as a model's is.
void dump_moe_pooled(fs::path const& out) {
  auto c = moe_config(true, 0.02);
  models::MoeFeedForward<T> first(c, 40), second(c, 50);
  Matrix const x = random_matrix(24, 16, 41), dy = random_matrix(24, 16, 42);
  fs::path const dir = out / "mixtral_pooled";
  fs::create_directories(dir);
  npy::write(dir / "x.npy", x), npy::write(dir / "dy.npy", dy);
  npy::write(dir / "y.npy", second.forward(first.forward(x)).local);
  npy::write(dir / "aux.npy", Eigen::VectorXd::Constant(1, models::load_balancing_loss(std::array{&first, &second})));
  sw::zero_grad(first), sw::zero_grad(second);
  npy::write(dir / "dx.npy", first.backward(second.backward(dy)).local);
  write_block(dir / "first", first);
  write_block(dir / "second", second);
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string_view(argv[2]) == "moe") {  // moe_reference.py's half only
    dump_moe(argv[1], "mixtral", moe_config(true, 0.0));  // every gradient comparable at fp64's precision
    dump_moe(argv[1], "mixtral_aux", moe_config(true, 0.02));
    dump_moe(argv[1], "qwen3_moe", moe_config(false, 0.0));
    dump_moe(argv[1], "qwen3_moe_aux", moe_config(false, 0.001));
    dump_moe(argv[1], "qwen2_moe", moe_config(false, 0.0, 20));  // with a gated shared expert
    auto deepseek = moe_config(true, 0.0, 24);  // sigmoid scores, biased choice in 2 of 4 groups, ungated shared
    deepseek.top_k = 3, deepseek.router = models::moe_router::sigmoid, deepseek.groups = 4, deepseek.top_groups = 2;
    deepseek.routed_scaling_factor = 2.5, deepseek.shared_expert_gated = false;
    dump_moe(argv[1], "deepseek_v3", deepseek);
    dump_moe_pooled(argv[1]);
    return 0;
  }
  if (argc != 2) {
    std::fprintf(stderr, "usage: tp_dump OUTPUT_DIR [moe]\n");
    return 2;
  }
  fs::path const out = argv[1];
  fs::create_directories(out);
  constexpr long tokens = 8, dim = 16, hidden = 32, heads = 4, vocab = 24;
  Matrix const x = random_matrix(tokens, dim, 1), dy = random_matrix(tokens, dim, 2);
  npy::write(out / "x.npy", x);
  npy::write(out / "dy.npy", dy);

  {  // weights, from the unsharded blocks (the sharded ones are built from the same seeds)
    blocks::FeedForward<T> mlp(dim, hidden, 10);
    npy::write(out / "mlp.w1.npy", mlp.w1.weight);
    npy::write(out / "mlp.w3.npy", mlp.w3.weight);
    npy::write(out / "mlp.w2.npy", mlp.w2.weight);
    blocks::Attention<T> attention(dim, heads, tokens, 20);
    auto weights = [&](std::string const& name, auto const& layer) {
      npy::write(out / ("attention." + name + ".weight.npy"), layer.weight);
      npy::write(out / ("attention." + name + ".bias.npy"), layer.bias);
    };
    weights("wq", attention.wq), weights("wk", attention.wk), weights("wv", attention.wv), weights("wo", attention.wo);
    NormFeedForward<T, sw::serial_plan> sp(dim, hidden);
    npy::write(out / "sp.norm.npy", sp.norm.weight);
    npy::write(out / "sp.w1.npy", sp.feed_forward.w1.weight);
    npy::write(out / "sp.w3.npy", sp.feed_forward.w3.weight);
    npy::write(out / "sp.w2.npy", sp.feed_forward.w2.weight);
  }

  sw::run_threads(2, [&](auto& world) {
    auto tp = sw::make_mesh<"tp">(world, {2});
    std::string const r = std::to_string(tp.rank());
    {
      blocks::FeedForward<T, mlp_plan> mlp(dim, hidden, 10);
      sw::parallelize(mlp, tp);
      npy::write(out / ("mlp.y." + r + ".npy"), mlp.forward(x).local);
      // Partial<Sum> (w1's and w3's parts): reduced to what PyTorch's replicated input receives.
      npy::write(out / ("mlp.dx." + r + ".npy"),
                 sw::redistribute<sw::Replicate>(tp, mlp.backward(sw::Activation<T>{dy})).local);
      npy::write(out / ("mlp.w1.grad." + r + ".npy"), mlp.w1.weight_grad);
      npy::write(out / ("mlp.w3.grad." + r + ".npy"), mlp.w3.weight_grad);
      npy::write(out / ("mlp.w2.grad." + r + ".npy"), mlp.w2.weight_grad);
    }
    {
      blocks::Attention<T, attention_plan> attention(dim, heads, tokens, 20);
      sw::parallelize(attention, tp);
      npy::write(out / ("attention.y." + r + ".npy"), attention.forward(x).local);
      npy::write(out / ("attention.dx." + r + ".npy"),
                 sw::redistribute<sw::Replicate>(tp, attention.backward(sw::Activation<T>{dy})).local);
      auto gradients = [&](std::string const& name, auto const& layer) {
        npy::write(out / ("attention." + name + ".weight.grad." + r + ".npy"), layer.weight_grad);
        npy::write(out / ("attention." + name + ".bias.grad." + r + ".npy"), layer.bias_grad);
      };
      gradients("wq", attention.wq), gradients("wk", attention.wk), gradients("wv", attention.wv),
          gradients("wo", attention.wo);
    }
    {
      NormFeedForward<T, sp_plan> sp(dim, hidden);
      sw::parallelize(sp, tp);
      long const rows = tokens / 2;
      auto const y =
          sw::forward(sp.feed_forward, sp.norm(sw::Activation<T, sw::Shard<0>>{x.middleRows(tp.rank() * rows, rows)}));
      npy::write(out / ("sp.y." + r + ".npy"), y.local);
      auto const dx = sp.norm.backward(
          sw::backward(sp.feed_forward, sw::Activation<T, sw::Shard<0>>{dy.middleRows(tp.rank() * rows, rows)}));
      npy::write(out / ("sp.dx." + r + ".npy"), dx.local);
      npy::write(out / ("sp.norm.partial_grad." + r + ".npy"), *std::get<0>(sp.norm.parameters()).grad);
      npy::write(out / ("sp.norm.grad." + r + ".npy"), *std::get<0>(sw::reduce(sp.norm.parameters())).grad);
      npy::write(out / ("sp.w1.grad." + r + ".npy"), sp.feed_forward.w1.weight_grad);
      npy::write(out / ("sp.w2.grad." + r + ".npy"), sp.feed_forward.w2.weight_grad);
    }
    {  // loss parallel on logits cut along the vocabulary
      Matrix const logits = random_matrix(tokens, vocab, 5);
      std::vector<std::int64_t> const targets{3, 23, 0, 7, -100, 12, 12, 5};
      if (tp.rank() == 0) npy::write(out / "loss_parallel.logits.npy", logits);
      long const cols = vocab / 2;
      auto const result =
          sw::loss_parallel(tp, sw::Activation<T, sw::Shard<-1>>{logits.middleCols(tp.rank() * cols, cols)}, targets);
      Eigen::Matrix<double, 1, 1> loss;
      loss(0) = result.loss;
      npy::write(out / ("loss_parallel.loss." + r + ".npy"), loss);
      npy::write(out / ("loss_parallel.dlogits." + r + ".npy"), result.dlogits.local);
    }
  });

  {  // unsharded layers
    Matrix const xl = random_matrix(tokens, dim, 3), dyl = random_matrix(tokens, hidden, 4);
    npy::write(out / "layers.x.npy", xl);
    sw::Linear<T> linear(dim, hidden, 50);
    npy::write(out / "linear.weight.npy", linear.weight);
    npy::write(out / "linear.bias.npy", linear.bias);
    npy::write(out / "linear.y.npy", linear(xl).local);
    npy::write(out / "layers.dy_hidden.npy", dyl);
    npy::write(out / "linear.dx.npy", linear.backward(sw::Activation<T>{dyl}).local);
    npy::write(out / "linear.weight.grad.npy", linear.weight_grad);
    npy::write(out / "linear.bias.grad.npy", linear.bias_grad);

    Matrix const dyd = random_matrix(tokens, dim, 6);
    npy::write(out / "layers.dy.npy", dyd);
    sw::LayerNorm<T> layer_norm(dim, 1e-5);
    for (long i = 0; i < dim; ++i) layer_norm.weight(i) = 1.0 + 0.1 * double(i), layer_norm.bias(i) = 0.01 * double(i);
    npy::write(out / "layer_norm.weight.npy", layer_norm.weight);
    npy::write(out / "layer_norm.bias.npy", layer_norm.bias);
    npy::write(out / "layer_norm.y.npy", layer_norm(xl).local);
    npy::write(out / "layer_norm.dx.npy", layer_norm.backward(sw::Activation<T>{dyd}).local);
    npy::write(out / "layer_norm.weight.grad.npy", layer_norm.weight_grad);
    npy::write(out / "layer_norm.bias.grad.npy", layer_norm.bias_grad);

    sw::RMSNorm<T> rms_norm(dim, 1e-6);
    for (long i = 0; i < dim; ++i) rms_norm.weight(i) = 1.0 - 0.02 * double(i);
    npy::write(out / "rms_norm.weight.npy", rms_norm.weight);
    npy::write(out / "rms_norm.y.npy", rms_norm(xl).local);
    npy::write(out / "rms_norm.dx.npy", rms_norm.backward(sw::Activation<T>{dyd}).local);
    npy::write(out / "rms_norm.weight.grad.npy", rms_norm.weight_grad);

    sw::Embedding<T> embedding(vocab, dim, 60);
    std::vector<std::int64_t> const ids{3, 23, 0, 7, 3, 12, 19, 5};
    npy::write(out / "embedding.weight.npy", embedding.weight);
    npy::write(out / "embedding.y.npy", embedding(ids).local);
    embedding.backward(sw::Activation<T>{dyd});
    npy::write(out / "embedding.weight.grad.npy", embedding.weight_grad);

    Matrix const logits = random_matrix(tokens, vocab, 7);
    std::vector<std::int64_t> const targets{1, 2, -100, 23, 0, 4, 4, 9};
    auto const ce = sw::cross_entropy(sw::Activation<T>{logits}, targets);
    npy::write(out / "cross_entropy.logits.npy", logits);
    Eigen::Matrix<double, 1, 1> loss;
    loss(0) = ce.loss;
    npy::write(out / "cross_entropy.loss.npy", loss);
    npy::write(out / "cross_entropy.dlogits.npy", ce.dlogits.local);
  }
  std::puts("tp_dump: written");
  return 0;
}
