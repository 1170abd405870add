// Lazy models: declared without parameters, parallelized (each layer records its shard's shape only),
// materialized as this rank's shard alone, filled, and then the same model as one built eagerly.
#include <doctest/doctest.h>

#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <stdexcept>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

namespace {
models::LlamaConfig config() {
  models::LlamaConfig c;
  c.vocabulary = 30, c.dim = 32, c.layers = 2, c.heads = 4, c.kv_heads = 1, c.hidden = 64, c.sequence = 8;
  return c;  // vocabulary padded and key-value heads repeated at TP 2 and 4: lazily too
}
using Model = models::Llama<float, models::llama_plan<true>>;
}  // namespace

TEST_CASE("Lazy: nothing is allocated until materialize, then each rank holds exactly its eager shard") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::make_mesh<"tp">(world, {ranks});
      Model eager(config());
      sw::parallelize(eager, tp);
      sw::Lazy<Model> lazy(config());
      sw::parallelize(lazy, tp);
      std::size_t held = 0;
      sw::detail::for_each_parameter(lazy.unmaterialized(), [&](auto const& p) {
        held += static_cast<std::size_t>(p.value->size() + p.grad->size());
      });
      CHECK(held == 0);
      Model later(config());  // built after the lazy one, with the same config: allocated as usual
      std::size_t later_held = 0;
      sw::detail::for_each_parameter(later,
                                     [&](auto const& p) { later_held += static_cast<std::size_t>(p.value->size()); });
      CHECK(later_held > 0);

      Model& model = sw::materialize(lazy);
      std::vector<float const*> sources;
      sw::detail::for_each_parameter(eager, [&](auto const& p) { sources.push_back(p.value->data()); });
      std::size_t i = 0;
      sw::detail::for_each_parameter(model, [&](auto const& p) {
        // The shapes come from the lazy layers alone; the values stand in for a checkpoint's slices.
        using Tensor = typename std::remove_cvref_t<decltype(p)>::tensor_type;
        Tensor const* eager_value = nullptr;
        std::size_t k = 0;
        sw::detail::for_each_parameter(eager, [&](auto const& q) {
          if constexpr (std::is_same_v<typename std::remove_cvref_t<decltype(q)>::tensor_type, Tensor>)
            if (k == i) eager_value = q.value;
          ++k;
        });
        REQUIRE(eager_value != nullptr);
        CHECK(p.value->rows() == eager_value->rows());
        CHECK(p.value->cols() == eager_value->cols());
        CHECK(p.grad->size() == p.value->size());
        CHECK((p.value->array() == 0).all());
        *p.value = *eager_value;
        ++i;
      });
      CHECK(i == sources.size());

      std::vector<std::int64_t> ids;
      for (int t = 0; t < 16; ++t) ids.push_back((t * 7 + 3) % 30);
      auto const expected = eager.forward(ids);
      auto const got = model.forward(ids);
      CHECK(got.local == expected.local);
    });
  }
}

TEST_CASE("Lazy: a materialized model allocates gradients on first use and then trains like the eager one") {
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    sw::run_threads(ranks, [&](auto& world) {
      auto const mesh = sw::make_mesh<"dp", "tp">(world, {1, ranks});
      auto const tp = sw::submesh<"tp">(mesh);
      auto const dp = sw::submesh<"dp">(mesh);
      Model eager(config());
      sw::parallelize(eager, tp);
      sw::Lazy<Model> lazy(config());
      sw::parallelize(lazy, tp);
      Model& model = sw::materialize(lazy);

      // A load holds the parameters and no more: the weight matrices (Linear, Embedding) have no gradient yet.
      // Read through layer.parameters(), which allocates nothing (the optimizer's traversal would).
      std::size_t matrix_elements = 0, matrix_gradient_elements = 0;
      sw::detail::for_each_layer(model, [&](auto& layer) {
        std::apply(
            [&](auto const&... p) {
              auto count = [&](auto const& q) {
                if constexpr (std::remove_cvref_t<decltype(*q.value)>::ColsAtCompileTime != 1) {
                  matrix_elements += static_cast<std::size_t>(q.value->size());
                  matrix_gradient_elements += static_cast<std::size_t>(q.grad->size());
                }
              };
              (count(p), ...);
            },
            layer.parameters());
      });
      CHECK(matrix_elements > 0);
      CHECK(matrix_gradient_elements == 0);

      // Fill it as a checkpoint would, then train both the same way: identical losses and parameters.
      std::vector<float*> targets_of_copy;
      sw::detail::for_each_layer(model, [&](auto& layer) {
        std::apply([&](auto const&... p) { (targets_of_copy.push_back(p.value->data()), ...); }, layer.parameters());
      });
      std::size_t i = 0;
      sw::detail::for_each_layer(eager, [&](auto& layer) {
        std::apply(
            [&](auto const&... p) {
              ((std::copy(p.value->data(), p.value->data() + p.value->size(), targets_of_copy[i++])), ...);
            },
            layer.parameters());
      });
      sw::AdamW<float> eager_optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
      sw::AdamW<float> lazy_optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
      std::vector<std::int64_t> ids, targets;
      for (int t = 0; t < 16; ++t) ids.push_back((t * 7 + 3) % 30), targets.push_back((t * 5 + 1) % 30);
      for (int step = 0; step < 3; ++step) {
        auto const expected = models::llama_loss(tp, eager.forward(ids), targets, 30);
        auto const got = models::llama_loss(tp, model.forward(ids), targets, 30);
        CHECK(got.loss == expected.loss);
        eager.backward(expected.dlogits);
        model.backward(got.dlogits);
        eager_optimizer.step(sw::finish_gradients(eager), dp);
        lazy_optimizer.step(sw::finish_gradients(model), dp);
        sw::zero_grad(eager);
        sw::zero_grad(model);
      }
      std::vector<float> a, b;
      sw::detail::for_each_parameter(
          eager, [&](auto const& p) { a.insert(a.end(), p.value->data(), p.value->data() + p.value->size()); });
      sw::detail::for_each_parameter(
          model, [&](auto const& p) { b.insert(b.end(), p.value->data(), p.value->data() + p.value->size()); });
      CHECK(a == b);
    });
  }
}

TEST_CASE("Lazy: a layer used before it is materialized is refused with its path and the fix") {
  sw::run_threads(2, [&](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {2});
    sw::Lazy<Model> lazy(config());
    sw::parallelize(lazy, tp);
    std::vector<std::int64_t> ids(8, 1);
    CHECK_THROWS_WITH_AS(lazy.unmaterialized().forward(ids),
                         "shardwise::Embedding at \"tok_embeddings\": its parameters are not materialized (the model "
                         "was declared with sw::Lazy); fill it from a checkpoint or call sw::materialize(model) first",
                         sw::error);
    sw::Linear<float> alone_eager(4, 4, 1);  // built outside sw::Lazy: allocated as usual
    CHECK(alone_eager.weight.size() == 16);
  });
}

namespace {
struct Throws {
  sw::Linear<float> w;
  SHARDWISE_CHILDREN(w)
  explicit Throws(sw::init seed) : w(4, 4, seed) { throw std::runtime_error("built badly"); }
};

/// A block that hands one child a plain seed instead of the init it was given: that child would be allocated.
struct DropsTheMode {
  sw::Linear<float, sw::layer_at<sw::serial_plan, "kept">> kept;
  sw::Linear<float, sw::layer_at<sw::serial_plan, "dropped">> dropped;
  SHARDWISE_CHILDREN(kept, dropped)
  explicit DropsTheMode(sw::init seed) : kept(4, 4, seed + 1), dropped(4, 4, seed.seed() + 2) {}
};
}  // namespace

TEST_CASE("Lazy: a model that throws while being built throws out of sw::Lazy, and nothing lingers") {
  CHECK_THROWS_AS(sw::Lazy<Throws>(sw::init(1)), std::runtime_error);
  sw::Linear<float> after(4, 4, 1);  // the mode travels in the seed: nothing is left behind to leak
  CHECK(after.materialized());
  CHECK(after.weight.size() == 16);
}

TEST_CASE("Lazy: a layer its module built with a plain seed is refused, naming the layer and the fix") {
  CHECK_THROWS_WITH_AS(sw::Lazy<DropsTheMode>(sw::init(3)),
                       "shardwise::Lazy: the Linear at \"dropped\" was built with its parameters: the module that "
                       "holds it gave it a plain seed. Take the seed as sw::init in the module's constructor and "
                       "hand each child `seed + k` (a norm: pass it as its last argument), so that the children are "
                       "only declared",
                       sw::error);
  DropsTheMode eager(sw::init(3));  // built eagerly, it is an ordinary model
  CHECK(eager.kept.materialized());
  CHECK(eager.dropped.materialized());
}

TEST_CASE("sw::init: the mode travels with the seed's arithmetic") {
  sw::init const plain = 5;
  CHECK(plain.seed() == 5);
  CHECK_FALSE(plain.declares_only());
  auto const declared = sw::init::declared(5) + 7;
  CHECK(declared.seed() == 12);
  CHECK(declared.declares_only());
  sw::init moved = declared;
  moved += 1;
  CHECK(moved.seed() == 13);
  CHECK(moved.declares_only());
  CHECK(moved != sw::init(13));
}
