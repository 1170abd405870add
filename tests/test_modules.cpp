// Modules as users write them: plan entries applied at module calls (sw::forward / sw::backward), input
// gradients left Partial and reduced once, the collectives one Llama block sends (counted, per rank, against
// counts worked out from the sizes), the structure checks at parallelize, tied weights' run-time checks,
// finishing gradients more than once, AdamW parameter groups and its vectorised update, and the scalar
// all-reduce; the mixture-of-experts feed-forward against its dense definition (cases/moe_cases.hpp). Thread mesh.
#include <doctest/doctest.h>

#include <shardwise/mesh/counting.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <type_traits>

#include "../examples/blocks.hpp"

namespace {
namespace sw = shardwise;
namespace models = shardwise::models;
using Matrix = sw::nn::matrix<float>;

Matrix random_matrix(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  Matrix m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = u(rng);
  return m;
}

template <class Plan>
struct OneBlock {
  std::vector<models::LlamaBlock<float, sw::subplan<Plan, "layers.*">>> layers;
  SHARDWISE_CHILDREN(layers)
  explicit OneBlock(models::LlamaConfig const& c) { layers.emplace_back(c, 7); }
};

/// The block entries of llama_plan, for a model of one block.
template <bool SequenceParallel>
struct block_plan_of {
  template <class... E>
  static auto only_layers(sw::plan<E...>) -> sw::plan<E...>;
  using stream = std::conditional_t<SequenceParallel, sw::Shard<0>, sw::Replicate>;
  using norm = std::conditional_t<SequenceParallel, sw::SequenceParallel<>, sw::NoParallel>;
  using type = sw::plan<
      sw::at<"layers.*.attention_norm", norm>,
      sw::at<"layers.*.attention", sw::PrepareModuleInput<stream, sw::Replicate>>,
      sw::at<"layers.*.attention.wq", sw::ColwiseParallel<>>, sw::at<"layers.*.attention.wk", sw::ColwiseParallel<>>,
      sw::at<"layers.*.attention.wv", sw::ColwiseParallel<>>,
      sw::at<"layers.*.attention.wo", sw::RowwiseParallel<sw::Shard<-1>, stream>>, sw::at<"layers.*.ffn_norm", norm>,
      sw::at<"layers.*.feed_forward", sw::PrepareModuleInput<stream, sw::Replicate>>,
      sw::at<"layers.*.feed_forward.w1", sw::ColwiseParallel<>>,
      sw::at<"layers.*.feed_forward.w3", sw::ColwiseParallel<>>,
      sw::at<"layers.*.feed_forward.w2", sw::RowwiseParallel<sw::Shard<-1>, stream>>>;
};
}  // namespace

TEST_CASE("One Llama block: the collectives it sends per rank, and the same numbers as unsharded") {
  models::LlamaConfig c;
  c.dim = 32, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 8;
  std::size_t const tokens = 16, bytes = tokens * c.dim * sizeof(float);  // a [tokens, dim] fp32 activation
  Matrix const x = random_matrix(16, 32, 1), dy = random_matrix(16, 32, 2);
  OneBlock<sw::serial_plan> serial(c);
  auto const y0 = serial.layers[0].forward(sw::Activation<float>{x});
  auto const dx0 = serial.layers[0].backward(sw::Activation<float>{dy});
  auto run = [&](auto sequence_parallel) {
    constexpr bool sp = decltype(sequence_parallel)::value;
    using Plan = typename block_plan_of<sp>::type;
    using Stream = typename block_plan_of<sp>::stream;
    INFO((sp ? "TP 2 with sequence parallelism" : "TP 2"));
    sw::run_threads(2, [&](auto& world) {
      auto counted = sw::counting(world);
      auto const tp = sw::make_mesh<"tp">(counted, {2});
      OneBlock<Plan> model(c);
      sw::parallelize(model, tp);
      auto& block = model.layers[0];
      Eigen::Index const rows = sp ? 8 : 16, first = sp ? 8 * tp.rank() : 0;
      counted.log().clear();
      auto const y = block.forward(sw::Activation<float, Stream>{x.middleRows(first, rows)});
      auto const f = sw::count_of(counted.log().entries());
      counted.log().clear();
      auto const dx = block.backward(sw::Activation<float, Stream>{dy.middleRows(first, rows)});
      auto const b = sw::count_of(counted.log().entries());
      CHECK((y.local - y0.local.middleRows(first, rows)).cwiseAbs().maxCoeff() <= 1e-5f);
      CHECK((dx.local - dx0.local.middleRows(first, rows)).cwiseAbs().maxCoeff() <= 1e-5f);
      if (sp) {  // two PrepareModuleInput all-gathers and two reduce-scatters (wo, w2) forward; conjugates back
        CHECK(f.all_gather == 2);
        CHECK(f.all_gather_bytes == 2 * bytes / 2);
        CHECK(f.reduce_scatter == 2);
        CHECK(f.reduce_scatter_bytes == 2 * bytes);
        CHECK(f.all_reduce == 0);
        CHECK(b.all_gather == 2);
        CHECK(b.all_gather_bytes == 2 * bytes / 2);
        CHECK(b.reduce_scatter == 2);  // once per module, where there were 3 + 2 all-reduces
        CHECK(b.reduce_scatter_bytes == 2 * bytes);
        CHECK(b.all_reduce == 0);
      } else {  // wo and w2 all-reduce forward; backward, the two Partial input gradients once each
        CHECK(f.all_reduce == 2);
        CHECK(f.all_reduce_bytes == 2 * bytes);
        CHECK(f.calls() == 2);
        CHECK(b.all_reduce == 2);
        CHECK(b.all_reduce_bytes == 2 * bytes);
        CHECK(b.calls() == 2);
      }
    });
  };
  run(std::false_type{});
  run(std::true_type{});
}

namespace {
using ffn_plan =
    sw::plan<sw::at<"feed_forward", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
             sw::at<"feed_forward.w1", sw::ColwiseParallel<>>, sw::at<"feed_forward.w3", sw::ColwiseParallel<>>,
             sw::at<"feed_forward.w2", sw::RowwiseParallel<sw::Shard<-1>, sw::Shard<0>>>>;
struct WithFeedForward {
  blocks::FeedForward<float, sw::subplan<ffn_plan, "feed_forward">> feed_forward{8, 16, 3};
  SHARDWISE_CHILDREN(feed_forward)
};
struct LinearAndNorm {
  sw::Linear<float> lin{4, 3, 1};
  sw::LayerNorm<float> norm{3};
  SHARDWISE_CHILDREN(lin, norm)
};
}  // namespace

TEST_CASE("sw::forward / sw::backward apply a module's PrepareModuleInput; without an entry they are plain calls") {
  Matrix const x = random_matrix(6, 8, 3), dy = random_matrix(6, 8, 4);  // 6 tokens: uneven over 4 ranks
  blocks::FeedForward<float> serial(8, 16, 3);
  auto const y0 = serial.forward(x);
  auto const dx0 = serial.backward(sw::Activation<float>{dy});
  for (int ranks : {1, 2, 4}) {
    INFO(ranks << " ranks");
    sw::run_threads(ranks, [&](auto& world) {
      auto const tp = sw::make_mesh<"tp">(world, {ranks});
      WithFeedForward model;
      sw::parallelize(model, tp);
      auto const n = std::size_t(ranks), r = std::size_t(tp.rank());
      auto const first = Eigen::Index(sw::chunk_offset(6, n, r)), rows = Eigen::Index(sw::chunk_size(6, n, r));
      auto const y = sw::forward(model.feed_forward, sw::Activation<float, sw::Shard<0>>{x.middleRows(first, rows)});
      static_assert(std::is_same_v<typename decltype(y)::placement, sw::Shard<0>>);
      if (rows > 0)
        CHECK((y.local - y0.local.middleRows(first, rows)).cwiseAbs().maxCoeff() <= 1e-5f);  // 0: rank 4 of 4
      CHECK(y.local.rows() == rows);
      auto const dx = sw::backward(model.feed_forward, sw::Activation<float, sw::Shard<0>>{dy.middleRows(first, rows)});
      static_assert(std::is_same_v<typename decltype(dx)::placement, sw::Shard<0>>);  // reduce-scattered once
      if (rows > 0) CHECK((dx.local - dx0.local.middleRows(first, rows)).cwiseAbs().maxCoeff() <= 1e-5f);
      CHECK(dx.local.rows() == rows);
    });
  }
  blocks::FeedForward<float> plain(8, 16, 3);  // no plan entry: the module's own forward and backward
  CHECK((sw::forward(plain, x).local - y0.local).cwiseAbs().maxCoeff() == 0.0f);
  CHECK((sw::backward(plain, sw::Activation<float>{dy}).local - dx0.local).cwiseAbs().maxCoeff() == 0.0f);
}

namespace {
template <class T, class Plan>
struct Forgetful {  // holds w3 but does not list it
  sw::Linear<T, sw::layer_at<Plan, "w1">> w1;
  sw::Linear<T, sw::layer_at<Plan, "w3">> w3;
  SHARDWISE_CHILDREN(w1)
  Forgetful() : w1(8, 16, 1), w3(8, 16, 2) {}
};
template <class T, class Plan>
struct Outer {
  std::vector<Forgetful<T, sw::subplan<Plan, "layers.*">>> layers;
  SHARDWISE_CHILDREN(layers)
  Outer() { layers.resize(2); }
};
template <class T, class Plan>
struct Tied {
  sw::Embedding<T, sw::layer_at<Plan, "tok_embeddings">> tok_embeddings;
  sw::Linear<T, sw::layer_at<Plan, "output">> output;
  SHARDWISE_CHILDREN(tok_embeddings, output)
  Tied(std::size_t out) : tok_embeddings(16, 8, 1), output(8, out, 2, false) {}
};
}  // namespace

namespace {
/// A Linear of the user's that adds to the library's: the walks must call its members, not its base's core's.
template <class T, class Location>
struct CountingLinear : sw::Linear<T, Location> {
  using sw::Linear<T, Location>::Linear;
  int zeroed = 0;
  void zero_grad() {
    ++zeroed;
    sw::Linear<T, Location>::zero_grad();
  }
};
template <class T, class Plan>
struct WithCounting {
  CountingLinear<T, sw::layer_at<Plan, "w1">> w1;
  sw::Linear<T, sw::layer_at<Plan, "w2">> w2;
  SHARDWISE_CHILDREN(w1, w2)
  WithCounting() : w1(8, 16, 1), w2(16, 8, 2) {}
};
}  // namespace

TEST_CASE("the walks take a library layer by its core, and a class derived from one whole") {
  using Model = WithCounting<float, sw::plan<>>;
  static_assert(std::is_same_v<sw::detail::layer_core_t<decltype(Model::w1)>, decltype(Model::w1)>);
  static_assert(std::is_same_v<sw::detail::layer_core_t<decltype(Model::w2)>,
                               typename decltype(Model::w2)::shardwise_core::type>);
  Model model;
  sw::zero_grad(model);
  CHECK(model.w1.zeroed == 1);
  sw::zero_grad(model);
  CHECK(model.w1.zeroed == 2);
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
static_assert(std::is_same_v<sw::style_at<sw::serial_plan, "w1">, sw::layer_at<sw::serial_plan, "w1">>);  // former name
#pragma GCC diagnostic pop

// A module whose template takes a value before its plan: parallelize reads the plan off it all the same.
template <std::size_t Hidden, class T, class Plan>
struct ValueFirst {
  blocks::FeedForward<T, sw::subplan<Plan, "ff">> ff;
  SHARDWISE_CHILDREN(ff)
  ValueFirst() : ff(8, Hidden, 1) {}
};

TEST_CASE("a layer's type holds its style, its path and the plan's entries around it, not the whole plan") {
  using colwise_w1 = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>>;
  using colwise_w1_w3 = sw::plan<sw::at<"w1", sw::ColwiseParallel<>>, sw::at<"w3", sw::ColwiseParallel<>>>;
  using one = blocks::FeedForward<float, colwise_w1>;
  using two = blocks::FeedForward<float, colwise_w1_w3>;
  static_assert(std::is_same_v<decltype(one::w1), decltype(two::w1)>);   // same style, same path
  static_assert(!std::is_same_v<decltype(one::w3), decltype(two::w3)>);  // NoParallel against ColwiseParallel
  using prepared = sw::plan<sw::at<"ff", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>,
                            sw::at<"ff.w1", sw::ColwiseParallel<>>>;
  using inner = decltype(ValueFirst<16, float, prepared>::ff);
  static_assert(std::is_same_v<decltype(inner::w1)::shardwise_location::enclosing,
                               sw::plan<sw::at<"ff", sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>>>);
  static_assert(std::is_same_v<sw::detail::plan_of_tree_t<ValueFirst<16, float, prepared>>, prepared>);
  static_assert(std::is_same_v<sw::detail::plan_of_tree_t<inner>, prepared>);  // from a scoped plan
  static_assert(std::is_same_v<sw::detail::module_style_t<inner>, sw::PrepareModuleInput<sw::Shard<0>, sw::Replicate>>);
  sw::run_threads(2, [](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {2});
    ValueFirst<16, float, sw::plan<sw::at<"ff.w1", sw::ColwiseParallel<>>>> model;
    sw::parallelize(model, tp.template axis<"tp">());
    CHECK(model.ff.w1.weight.rows() == 8);   // ColwiseParallel: 16 output features over 2 ranks
    CHECK(model.ff.w2.weight.cols() == 16);  // no entry: whole
  });
}

// SHARDWISE_HOOKS takes every hook there is in one list.
struct EveryHookListed {
  SHARDWISE_HOOKS(static_check, on_parallelize, config, other_stage, after_pipeline_step, on_context_parallel,
                  token_wise, position_limit)
};
static_assert(EveryHookListed::shardwise_hooks::has<sw::hooks::static_check> &&
              EveryHookListed::shardwise_hooks::has<sw::hooks::on_context_parallel> &&
              EveryHookListed::shardwise_hooks::has<sw::hooks::token_wise> &&
              EveryHookListed::shardwise_hooks::has<sw::hooks::position_limit>);

TEST_CASE("parallelize finds a layer a module holds but does not list, on every rank") {
  sw::run_threads(2, [](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {2});
    Forgetful<float, sw::plan<sw::at<"w1", sw::ColwiseParallel<>>>> model;
    CHECK_THROWS_WITH_AS(sw::parallelize(model, tp),
                         "shardwise::parallelize: the module at \"\" holds a Linear (plan path \"w3\") that its "
                         "SHARDWISE_CHILDREN does not list; add the member to the list, or it gets no shard, no "
                         "optimizer step and no checkpoint entry",
                         sw::error);
    Outer<float, sw::plan<>> nested;  // in the elements of a repeated child too, named by index
    CHECK_THROWS_WITH_AS(sw::parallelize(nested, tp),
                         doctest::Contains("the module at \"layers.0\" holds a Linear (plan path \"layers.*.w3\")"),
                         sw::error);
  });
}

TEST_CASE("tied weights: a wrong shape and a tie after parallelize are refused; the tie survives a copy") {
  using Plan = sw::plan<sw::at<"tok_embeddings", sw::RowwiseParallel<sw::Replicate, sw::Replicate>>,
                        sw::at<"output", sw::ColwiseParallel<sw::Replicate, sw::Replicate>>>;
  Tied<float, Plan> wrong(12);
  CHECK_THROWS_WITH_AS(sw::tie_weights(wrong.output, wrong.tok_embeddings),
                       "shardwise::tie_weights: the Linear at \"output\" has a [12, 8] weight but the layer at "
                       "\"tok_embeddings\" owns a [16, 8] one; tie layers of the same shape ([vocabulary, dim] for an "
                       "output projection)",
                       sw::error);
  sw::run_threads(2, [](auto& world) {
    auto const tp = sw::make_mesh<"tp">(world, {2});
    Tied<float, Plan> late(16);
    sw::parallelize(late, tp);
    CHECK_THROWS_WITH_AS(sw::tie_weights(late.output, late.tok_embeddings),
                         "shardwise::tie_weights: the Linear at \"output\" is already parallelized, padded or "
                         "repeated; tie weights in the model's constructor",
                         sw::error);
    Tied<float, Plan> model(16);
    sw::tie_weights(model.output, model.tok_embeddings);
    Tied<float, Plan> copy = model;  // the copy's output uses the copy's table, not the original's
    sw::parallelize(copy, tp);
    copy.tok_embeddings.weight.setConstant(0.5f);
    Matrix const x = random_matrix(3, 8, 9);
    auto const y = copy.output(x);
    REQUIRE(y.local.cols() == 16);
    for (Eigen::Index i = 0; i < 3; ++i) CHECK(std::abs(y.local(i, 0) - 0.5f * x.row(i).sum()) <= 1e-5f);
    CHECK(model.tok_embeddings.weight.cwiseAbs().maxCoeff() != 0.5f);
  });
}

TEST_CASE("finishing gradients twice, and across accumulation, counts every contribution once") {
  models::LlamaConfig c;
  c.vocabulary = 32, c.dim = 16, c.layers = 1, c.heads = 4, c.kv_heads = 1, c.hidden = 32, c.sequence = 4;
  std::vector<std::int64_t> const ids{1, 5, 9, 3, 7, 2, 0, 4}, targets{5, 9, 3, 7, 2, 0, 4, 1};
  auto gradients = [&](bool finish_between) {
    std::vector<Matrix> all;
    sw::run_threads(2, [&](auto& world) {
      auto const tp = sw::make_mesh<"tp">(world, {2});
      models::Llama<float, models::llama_plan<true>> model(c);  // SP norms (Partial) and 2 copies of the kv head
      sw::parallelize(model, tp);
      for (int pass = 0; pass < 2; ++pass) {
        auto const logits = model.forward(ids);
        model.backward(models::llama_loss(tp, logits, targets, c.vocabulary).dlogits);
        if (finish_between) (void)sw::finish_gradients(model), (void)sw::finish_gradients(model);
      }
      auto finished = sw::finish_gradients(model);
      std::vector<Matrix> mine;
      sw::for_each_parameter(finished, [&](std::string const&, auto const& p) {
        auto const g = sw::full_gradient(p);
        mine.push_back(Eigen::Map<Matrix const>(g.data(), g.rows(), g.cols()));
      });
      if (tp.rank() == 0) all = mine;
    });
    return all;
  };
  auto const once = gradients(false), often = gradients(true);
  REQUIRE(once.size() == often.size());
  for (std::size_t i = 0; i < once.size(); ++i) {
    INFO("parameter " << i);
    CHECK((once[i] - often[i]).cwiseAbs().maxCoeff() <= 1e-5f * std::max(1.0f, once[i].cwiseAbs().maxCoeff()));
  }
}

TEST_CASE("AdamW parameter groups: biases and norms without weight decay") {
  LinearAndNorm model;
  Matrix const w = model.lin.weight;
  Eigen::VectorXf const b = model.lin.bias, gamma = model.norm.weight;
  model.norm.bias.setConstant(0.25f);
  // Zero gradients: AdamW's moment update moves nothing, so only the decoupled decay acts: w <- w (1 - lr wd).
  sw::AdamW<float> optimizer({.learning_rate = 0.1f,
                              .weight_decay = 0.5f,
                              .groups = {{.matches = sw::names_matching({"*.bias", "norm.*"}), .weight_decay = 0.0f}}});
  optimizer.step(model, sw::make_mesh<"dp">(sw::serial_world(), {1}));
  CHECK((model.lin.weight - w * 0.95f).cwiseAbs().maxCoeff() <= 1e-7f);
  CHECK(model.lin.bias == b);
  CHECK(model.norm.weight == gamma);
  CHECK(model.norm.bias == Eigen::VectorXf::Constant(3, 0.25f));
  CHECK(sw::name_matches("layers.*.attention.w?", "layers.0.attention.w?"));
  CHECK(sw::name_matches("*norm.weight", "layers.3.ffn_norm.weight"));
  CHECK(!sw::name_matches("*.bias", "layers.0.bias_scale"));
}

TEST_CASE("Learning-rate schedules that cannot describe a run are refused, naming the field and the fix") {
  using kind = sw::schedule_kind;
  auto options = [](sw::LearningRateSchedule s) { return sw::AdamWOptions<float>{.schedule = s}; };
  CHECK_THROWS_WITH_AS(sw::AdamW<float>(options({.kind = kind::cosine, .warmup_steps = 120, .total_steps = 100})),
                       "shardwise::LearningRateSchedule: warmup_steps (120) is longer than the run (total_steps 100); "
                       "shorten the warm-up or lengthen the run",
                       sw::error);
  CHECK_THROWS_WITH_AS(sw::AdamW<float>(options({.kind = kind::linear, .warmup_steps = 10})),
                       "shardwise::LearningRateSchedule: a linear schedule needs total_steps, the run's optimizer "
                       "steps; set .total_steps",
                       sw::error);
  CHECK_THROWS_WITH_AS(sw::AdamW<float>(options({.kind = kind::cosine, .total_steps = 9, .min_lr_rate = 1.5})),
                       "shardwise::LearningRateSchedule: min_lr_rate is 1.5; give a fraction of the learning rate in "
                       "[0, 1]",
                       sw::error);
  CHECK_THROWS_WITH_AS(sw::AdamW<float>(options({.kind = kind::cosine, .total_steps = 9, .num_cycles = 0})),
                       "shardwise::LearningRateSchedule: num_cycles is 0; give a positive number (0.5: half a cosine)",
                       sw::error);
  sw::AdamW<float> fine(options({.warmup_steps = 10}));  // a constant schedule's warm-up needs no run length
  CHECK_THROWS_AS(fine.set_schedule({.kind = kind::linear, .warmup_steps = 5, .total_steps = 4}), sw::error);
  CHECK(fine.options().schedule.warmup_steps == 10);  // a refused schedule leaves the optimizer's as it was
}

TEST_CASE("The loss over a step's valid tokens: shares that add up to the mean, and its misuses refused") {
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  Eigen::MatrixXd logits(4, 5);
  for (Eigen::Index i = 0; i < logits.size(); ++i) logits.data()[i] = std::sin(double(i));
  std::vector<std::int64_t> const first{1, -100, 3, 4}, second{-100, -100, 0, 2};
  auto const tokens = sw::count_valid_tokens(dp, std::vector{first, second});
  CHECK(tokens.global == 5);
  CHECK(tokens.data_ranks == 1);
  // The two shares add up to the mean over all five targets, and so do their gradients.
  Eigen::MatrixXd both(8, 5);
  both << logits, logits;
  std::vector<std::int64_t> all = first;
  all.insert(all.end(), second.begin(), second.end());
  auto const whole = sw::cross_entropy(sw::Activation<double, sw::Replicate>{both}, all);
  auto const a = sw::cross_entropy(dp, sw::Activation<double, sw::Replicate>{logits}, first, tokens);
  auto const b = sw::cross_entropy(dp, sw::Activation<double, sw::Replicate>{logits}, second, tokens);
  CHECK(std::abs(a.loss + b.loss - whole.loss) <= 1e-15);
  CHECK((a.dlogits.local - whole.dlogits.local.topRows(4)).cwiseAbs().maxCoeff() <= 1e-16);
  CHECK((b.dlogits.local - whole.dlogits.local.bottomRows(4)).cwiseAbs().maxCoeff() <= 1e-16);
  CHECK(std::abs(sw::cross_entropy(dp, sw::Activation<double, sw::Replicate>{logits}, first).loss - a.loss) > 0.1);

  CHECK_THROWS_WITH_AS(sw::count_valid_tokens(dp, std::vector<std::vector<std::int64_t>>{}),
                       "shardwise::count_valid_tokens: 1 data rank(s) gave no microbatch; a step needs at least one "
                       "microbatch on every rank (gradient accumulation steps of 0 train nothing)",
                       sw::error);
  CHECK_THROWS_WITH_AS(
      sw::cross_entropy(dp, sw::Activation<double, sw::Replicate>{logits}, first, sw::valid_tokens{.global = 2}),
      "shardwise::nn::cross_entropy_forward_backward: 3 valid targets here but 2 in the whole step; "
      "count every microbatch's targets with sw::count_valid_tokens",
      sw::error);
}

template <class T>
struct OneLinear {
  sw::Linear<T> lin{37, 29, 5};  // 1073 weights, 29 biases: neither a multiple of the vector width nor the block
  SHARDWISE_CHILDREN(lin)
};

/// AdamW's update of one element (torch.optim.AdamW's formula), written out as a scalar loop would: the
/// reference the vectorised update must equal bit for bit (this build does not fuse multiply-adds).
template <class T>
void torch_adamw_element(T& w, T g, T& m, T& v, std::size_t step, T lr, T decay) {
  T const beta1 = T(0.9), beta2 = T(0.999), eps = T(1e-8);
  T const correction1 = T(1) - std::pow(beta1, T(step)), correction2 = T(1) - std::pow(beta2, T(step));
  w -= lr * decay * w;
  m = beta1 * m + (T(1) - beta1) * g;
  v = beta2 * v + (T(1) - beta2) * g * g;
  w -= lr * (m / correction1) / (std::sqrt(v / correction2) + eps);
}

TEST_CASE_TEMPLATE("AdamW's vectorised update equals the scalar formula bit for bit, at sizes no block divides", T,
                   float, double) {
  OneLinear<T> model;
  auto& lin = model.lin;
  T const max_norm = T(0.05);  // below every step's norm: the gradients are clipped
  sw::AdamW<T> optimizer({.learning_rate = T(0.01), .weight_decay = T(0.1), .max_grad_norm = max_norm});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  sw::nn::matrix<T> w = lin.weight, m = sw::nn::matrix<T>::Zero(w.rows(), w.cols()), v = m;
  sw::nn::vector<T> b = lin.bias, bm = sw::nn::vector<T>::Zero(b.size()), bv = bm;
  for (std::size_t step = 1; step <= 3; ++step) {
    for (Eigen::Index i = 0; i < w.size(); ++i)  // gradients spanning magnitudes, some zero
      lin.weight_grad.data()[i] = i % 7 == 0 ? T(0) : std::sin(T(i) * T(0.37)) * std::pow(T(10), T(i % 5) - T(3));
    for (Eigen::Index i = 0; i < b.size(); ++i) lin.bias_grad(i) = T(0.5) - T(i) / T(16);
    T const norm = optimizer.step(model, dp);  // before clipping
    REQUIRE(norm > max_norm);
    T const clip = max_norm / (norm + T(1e-6));  // torch.nn.utils.clip_grad_norm_
    for (Eigen::Index i = 0; i < w.size(); ++i)
      torch_adamw_element(w.data()[i], lin.weight_grad.data()[i] * clip, m.data()[i], v.data()[i], step, T(0.01),
                          T(0.1));
    for (Eigen::Index i = 0; i < b.size(); ++i)
      torch_adamw_element(b(i), lin.bias_grad(i) * clip, bm(i), bv(i), step, T(0.01), T(0.1));
    INFO("step " << step);
    CHECK(lin.weight == w);
    CHECK(lin.bias == b);
  }
}

TEST_CASE("sw::all_reduce of one number, the same on every rank") {
  for (int ranks : {1, 2, 4})
    sw::run_threads(ranks, [&](auto& world) {
      auto const mesh = sw::make_mesh<"dp">(world, {ranks});
      float const mine = float(mesh.rank() + 1);
      CHECK(sw::all_reduce(mesh, mine, sw::Avg{}) == float(ranks + 1) / 2);
      CHECK(sw::all_reduce(mesh, mine) == float(ranks * (ranks + 1) / 2));
      CHECK(sw::all_reduce(mesh, mesh.rank(), sw::Max{}) == ranks - 1);
    });
}

TEST_CASE("activation arithmetic on temporaries reuses their storage and gives the same bits; shapes are checked") {
  using A = sw::Activation<float, sw::Shard<-1>>;
  Matrix const x = Matrix::Random(5, 7), y = Matrix::Random(5, 7);
  A const a{x}, b{y};
  A const sum = a + b, product = a * b;
  auto const temporary = [](Matrix const& m, float const** storage) {
    A t{m};
    *storage = t.local.data();
    return t;
  };
  for (int which = 0; which < 3; ++which) {  // the temporary on the left, on the right, on both sides
    CAPTURE(which);
    float const *left = nullptr, *right = nullptr;
    A const s = which == 0   ? temporary(x, &left) + b
                : which == 1 ? a + temporary(y, &right)
                             : temporary(x, &left) + temporary(y, &right);
    CHECK(s.local == sum.local);  // bit for bit: addition commutes
    CHECK((s.local.data() == left || s.local.data() == right));
    A const p = which == 0   ? temporary(x, &left) * b
                : which == 1 ? a * temporary(y, &right)
                             : temporary(x, &left) * temporary(y, &right);
    CHECK(p.local == product.local);
    CHECK((p.local.data() == left || p.local.data() == right));
  }
  float const* storage = nullptr;
  A const s = sw::silu(temporary(x, &storage));
  CHECK(s.local == sw::silu(a).local);
  CHECK(s.local.data() == storage);
  A const ds = sw::silu_backward(a, temporary(y, &storage));
  CHECK(ds.local == sw::silu_backward(a, b).local);
  CHECK(ds.local.data() == storage);

  A const narrow{Matrix::Random(5, 6)};
  auto const message = [](auto&& fn) {
    try {
      fn();
    } catch (sw::error const& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string const expected = "activations of 5x7 and 5x6 on this rank; element-wise arithmetic needs the same shape";
  CHECK(message([&] { (void)(a + narrow); }).find("shardwise::operator+: " + expected) != std::string::npos);
  CHECK(message([&] { (void)(a * A{narrow}); }).find("shardwise::operator*: " + expected) != std::string::npos);
  CHECK(message([&] { (void)(A{x} + narrow); }).find("shardwise::operator+: " + expected) != std::string::npos);
}

#include "cases/moe_cases.hpp"
