// Several microbatches in flight (sw::saved_activations) and activation checkpointing
// (sw::checkpointed_forward / checkpointed_backward): both must give exactly the numbers of running each
// microbatch's forward and backward back to back — the same code on the same numbers, so compared with ==.
// Unsharded and at TP 2 with sequence parallelism, thread mesh.
#include <doctest/doctest.h>

#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>

#include "../examples/blocks.hpp"

namespace {
namespace sw = shardwise;
namespace models = shardwise::models;
using Matrix = sw::nn::matrix<float>;

models::LlamaConfig small_llama() {
  models::LlamaConfig c;
  c.vocabulary = 32, c.dim = 16, c.layers = 2, c.heads = 4, c.kv_heads = 2, c.hidden = 32, c.sequence = 4;
  return c;
}

/// Two microbatches of two sequences each, and their targets.
struct batches {
  std::vector<std::int64_t> ids[2] = {{1, 5, 9, 3, 7, 2, 0, 4}, {8, 6, 4, 2, 1, 3, 5, 7}};
  std::vector<std::int64_t> targets[2] = {{5, 9, 3, 7, 2, 0, 4, 1}, {6, 4, 2, 1, 3, 5, 7, 8}};
};

/// Every parameter's full gradient on rank 0, in for_each_parameter's order.
template <class Model>
std::vector<Matrix> full_gradients(Model& model) {
  std::vector<Matrix> all;
  sw::for_each_parameter(sw::finish_gradients(model), [&](std::string const&, auto const& p) {
    auto const g = sw::full_gradient(p);
    all.push_back(Eigen::Map<Matrix const>(g.data(), g.rows(), g.cols()));
  });
  return all;
}

/// The Llama's gradients after two microbatches, at TP `tp` (sequence parallel above 1): back to back, or
/// with both forwards before both backwards.
template <class Plan>
std::vector<Matrix> llama_gradients(int tp_size, bool in_flight) {
  auto const c = small_llama();
  batches const data;
  std::vector<Matrix> rank0;
  sw::run_threads(tp_size, [&](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {tp_size});
    models::Llama<float, Plan> model(c);
    sw::parallelize(model, tp);
    auto loss_gradient = [&](auto const& logits, int m) {
      return models::llama_loss(tp, logits, data.targets[m], c.vocabulary).dlogits;
    };
    if (!in_flight) {
      for (int m = 0; m < 2; ++m) model.backward(loss_gradient(model.forward(data.ids[m]), m));
    } else {
      sw::saved_activations<decltype(model)> saved[2];
      auto const logits0 = model.forward(data.ids[0]);
      saved[0].take_from(model);
      auto const logits1 = model.forward(data.ids[1]);
      saved[1].take_from(model);
      saved[0].give_back(model);
      model.backward(loss_gradient(logits0, 0));
      saved[1].give_back(model);
      model.backward(loss_gradient(logits1, 1));
    }
    auto gradients = full_gradients(model);
    if (tp.rank() == 0) rank0 = std::move(gradients);
  });
  return rank0;
}

void require_identical(std::vector<Matrix> const& a, std::vector<Matrix> const& b) {
  REQUIRE(a.size() == b.size());
  REQUIRE(!a.empty());
  for (std::size_t i = 0; i < a.size(); ++i) {
    INFO("parameter " << i);
    REQUIRE(a[i].rows() == b[i].rows());
    REQUIRE(a[i].cols() == b[i].cols());
    CHECK(a[i] == b[i]);
  }
}

/// A module whose forward keeps a copy of its input, public so that the test can see it freed.
struct Probe {
  sw::Linear<float> proj{4, 4, 3};
  SHARDWISE_CHILDREN(proj)
  SHARDWISE_SAVED(kept)
  Matrix kept;
  template <class X>
  auto forward(X const& x) {
    kept = sw::detail::local_of<float>(x);
    return proj(x);
  }
  template <class DY>
  auto backward(DY const& dy) {
    auto dx = proj.backward(dy);
    dx.local += kept;  // uses what forward kept: a wrong kept would change the result
    return dx;
  }
};

}  // namespace

TEST_CASE("two microbatches in flight through a whole Llama give the gradients of running them back to back") {
  SUBCASE("unsharded") {
    require_identical(llama_gradients<sw::serial_plan>(1, false), llama_gradients<sw::serial_plan>(1, true));
  }
  SUBCASE("TP 2 with sequence parallelism") {
    using Plan = models::llama_plan<true>;
    require_identical(llama_gradients<Plan>(2, false), llama_gradients<Plan>(2, true));
  }
}

TEST_CASE("in flight, a microbatch's backward uses its own activations, not the last forward's") {
  // Without moving the activations out, the second forward overwrites the first's: the first backward then
  // gives the second microbatch's numbers. The check that the test can fail.
  auto const c = small_llama();
  batches const data;
  models::Llama<float> model(c);
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const logits0 = model.forward(data.ids[0]);
  auto const dlogits0 = models::llama_loss(tp, logits0, data.targets[0], c.vocabulary).dlogits;
  model.backward(dlogits0);
  auto const right = full_gradients(model);
  sw::zero_grad(model);
  (void)model.forward(data.ids[0]);
  (void)model.forward(data.ids[1]);  // nothing moved out: overwrites microbatch 0's activations
  model.backward(dlogits0);
  auto const wrong = full_gradients(model);
  REQUIRE(right.size() == wrong.size());
  bool any_differs = false;
  for (std::size_t i = 0; i < right.size(); ++i) any_differs = any_differs || right[i] != wrong[i];
  CHECK(any_differs);
}

TEST_CASE("activation checkpointing: a Llama block's results are those without it, bit for bit") {
  auto const c = small_llama();
  Matrix x(8, 16), dy(8, 16);
  for (Eigen::Index i = 0; i < x.size(); ++i) {
    x.data()[i] = std::sin(0.37f * static_cast<float>(i));
    dy.data()[i] = std::cos(0.11f * static_cast<float>(i));
  }
  auto run = [&](bool checkpointed) {
    models::LlamaBlock<float> block(c, 7);
    sw::Activation<float> const input{x};
    sw::checkpointed_input<sw::Activation<float>> kept;
    auto const y = checkpointed ? sw::checkpointed_forward(block, input, kept) : sw::forward(block, input);
    auto const dx = checkpointed ? sw::checkpointed_backward(block, kept, sw::Activation<float>{dy})
                                 : sw::backward(block, sw::Activation<float>{dy});
    std::vector<Matrix> out{y.local, dx.local};
    for (auto& g : full_gradients(block)) out.push_back(std::move(g));
    return out;
  };
  require_identical(run(false), run(true));
}

TEST_CASE("activation checkpointing at TP 2 with sequence parallelism equals the run without it") {
  auto const c = small_llama();
  auto run = [&](bool checkpointed) {
    std::vector<Matrix> rank0;
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::make_mesh<"tp">(world, {2});
      models::Llama<float, models::llama_plan<true>> model(c);
      sw::parallelize(model, tp);
      batches const data;
      auto h = model.tok_embeddings(data.ids[0]);
      using H = decltype(h);
      std::vector<sw::checkpointed_input<H>> kept(model.layers.size());
      for (std::size_t i = 0; i < model.layers.size(); ++i)
        h = checkpointed ? sw::checkpointed_forward(model.layers[i], h, kept[i]) : sw::forward(model.layers[i], h);
      auto const logits = model.output(model.norm(h));
      auto dh = model.norm.backward(
          model.output.backward(models::llama_loss(tp, logits, data.targets[0], c.vocabulary).dlogits));
      for (std::size_t i = model.layers.size(); i-- > 0;)
        dh = checkpointed ? sw::checkpointed_backward(model.layers[i], kept[i], dh) : sw::backward(model.layers[i], dh);
      model.tok_embeddings.backward(dh);
      auto gradients = full_gradients(model);
      if (tp.rank() == 0) rank0 = std::move(gradients);
    });
    return rank0;
  };
  require_identical(run(false), run(true));
}

TEST_CASE("checkpointed_forward frees what the forward kept; checkpointed_backward recomputes it") {
  using A = sw::Activation<float>;
  Probe probe;
  A const x{Matrix::Constant(3, 4, 0.5f)}, dy{Matrix::Constant(3, 4, 1.0f)};
  sw::checkpointed_input<A> kept;
  (void)sw::checkpointed_forward(probe, x, kept);
  CHECK(probe.kept.size() == 0);
  CHECK(kept.input.local == x.local);
  auto const dx = sw::checkpointed_backward(probe, kept, dy);
  Probe plain;
  (void)sw::forward(plain, x);
  auto const expected = sw::backward(plain, dy);
  CHECK(dx.local == expected.local);
  CHECK(probe.kept.size() == 0);  // freed again after the backward
}

TEST_CASE("saved_activations moves buffers, it does not copy them") {
  Probe probe;
  (void)probe.forward(sw::Activation<float>{Matrix::Constant(3, 4, 2.0f)});
  float const* const buffer = probe.kept.data();
  sw::saved_activations<Probe> saved;
  saved.take_from(probe);
  CHECK(probe.kept.size() == 0);
  saved.give_back(probe);
  CHECK(probe.kept.data() == buffer);
  CHECK(probe.kept == Matrix::Constant(3, 4, 2.0f));
}
