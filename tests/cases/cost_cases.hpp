// A plan's cost (sw::cost) against what a counting mesh (sw::counting) records on a real run: the Llama
// attention, feed-forward and block under tensor parallelism with and without sequence parallelism, forward
// and backward, entry for entry (kind, axis, bytes, count, order), and the parameter and gradient bytes
// against the tensors the rank actually holds; and whole training steps of the Llama model (dp x tp, ZeRO-1,
// microbatches) against models::llama_step_cost; pipeline steps (GPipe, 1F1B, interleaved 1F1B over the Llama's
// stages) against sw::pipeline_step_cost; FSDP steps (full shard, shard-grad-op, no-shard, blocks as units)
// against models::llama_fsdp_step_cost. Included by test_cost.cpp (threads) and test_mpi_nn.cpp (MPI):
// run_cost_cases(world) runs every case on the ranks of `world`.
#pragma once
#include <doctest/doctest.h>

#include <memory>
#include <random>
#include <shardwise/context.hpp>
#include <shardwise/fsdp.hpp>
#include <shardwise/mesh/counting.hpp>
#include <shardwise/models/gpt2.hpp>
#include <shardwise/models/gpt2_plan.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_fsdp_cost.hpp>
#include <shardwise/models/llama_fsdp_pipeline_cost.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/models/llama_stage.hpp>
#include <shardwise/pipeline/cost.hpp>
#include <shardwise/shardwise.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

#include "support/transfers.hpp"

namespace cost_cases {
namespace sw = shardwise;
namespace models = shardwise::models;

template <class T>
sw::nn::matrix<T> random_matrix(Eigen::Index rows, Eigen::Index cols, unsigned seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  sw::nn::matrix<T> m(rows, cols);
  for (Eigen::Index i = 0; i < m.size(); ++i) m.data()[i] = static_cast<T>(u(rng));
  return m;
}

/// The block entries of a plan (those under "layers."), for a model of one block.
template <class Tuple>
struct as_plan;
template <class... E>
struct as_plan<std::tuple<E...>> {
  using type = sw::plan<E...>;
};
template <class E>
using keep_block_entry = std::conditional_t<E::path.view().starts_with("layers."), std::tuple<E>, std::tuple<>>;
template <class Plan>
struct block_entries;
template <class... E>
struct block_entries<sw::plan<E...>> {
  using type = typename as_plan<decltype(std::tuple_cat(std::declval<keep_block_entry<E>>()...))>::type;
};
template <bool SequenceParallel>
using block_plan = typename block_entries<models::llama_plan<SequenceParallel>>::type;

/// A model of one Llama block, so that the plan's "layers.*" entries apply.
template <class T, class Plan>
struct OneBlock {
  std::vector<models::LlamaBlock<T, sw::subplan<Plan, "layers.*">>> layers;
  SHARDWISE_CHILDREN(layers)
  explicit OneBlock(models::LlamaConfig const& c) { layers.emplace_back(c, 7); }
};

/// Bytes of every parameter and gradient tensor the model holds on this rank, as allocated (a Partial
/// gradient's pending sums and the tensor they are reduced into both count).
template <class Model>
std::pair<std::size_t, std::size_t> held_bytes(Model& model) {
  std::size_t parameters = 0, gradients = 0;
  sw::for_each_parameter(model, [&](auto const&, auto const& p) {
    using E = typename std::remove_cvref_t<decltype(*p.value)>::Scalar;
    parameters += static_cast<std::size_t>(p.value->size()) * sizeof(E);
    gradients += static_cast<std::size_t>(p.grad->size()) * sizeof(E);
    if (p.reduced_into) gradients += static_cast<std::size_t>(p.reduced_into->size()) * sizeof(E);
  });
  return {parameters, gradients};
}

/// Bytes of what a node's forward keeps for its backward (its SHARDWISE_SAVED members), as allocated.
template <class X>
std::size_t saved_bytes_of(X const& x) {
  if constexpr (requires { x.local; }) {  // an Activation
    return saved_bytes_of(x.local);
  } else if constexpr (requires { x.logsumexp; }) {  // the attention's softmax statistics and kept output
    return saved_bytes_of(x.logsumexp) + saved_bytes_of(x.output);
  } else if constexpr (requires { x.input; }) {  // a checkpointed block's input
    return saved_bytes_of(x.input);
  } else if constexpr (requires { x.lengths(); }) {  // sequence lengths: none held for whole sequences
    return saved_bytes_of(x.lengths());
  } else if constexpr (requires { typename X::Scalar; }) {  // an Eigen matrix or vector
    return static_cast<std::size_t>(x.size()) * sizeof(typename X::Scalar);
  } else {
    static_assert(requires { typename X::value_type; }, "saved_bytes_of: a saved member of an unknown kind");
    if constexpr (std::is_arithmetic_v<typename X::value_type>) return x.size() * sizeof(typename X::value_type);
    std::size_t bytes = 0;
    if constexpr (!std::is_arithmetic_v<typename X::value_type>)
      for (auto const& element : x) bytes += saved_bytes_of(element);
    return bytes;
  }
}

/// Bytes of everything the layers and modules of `model` keep between a forward and its backward.
template <class Model>
std::size_t held_activation_bytes(Model& model) {
  std::size_t bytes = 0;
  auto add = [&](auto& node) {
    if constexpr (requires { node.shardwise_saved(); })
      std::apply([&](auto&... member) { ((bytes += saved_bytes_of(member)), ...); }, node.shardwise_saved());
  };
  sw::detail::for_each_layer(model, add);
  sw::detail::for_each_module(model, add);
  return bytes;
}

/// A parameter as the cost model's walk states it and as the model holds it after parallelize.
struct walked_parameter {
  std::size_t elements = 0, rows = 0;
  bool partial = false, repeated = false;
  bool operator==(walked_parameter const&) const = default;
};
inline std::ostream& operator<<(std::ostream& out, walked_parameter const& p) {
  return out << p.elements << " elements in " << p.rows << " rows" << (p.partial ? ", partial" : "")
             << (p.repeated ? ", repeated" : "");
}

/// The parameters the model holds on this rank, in the order of sw::for_each_parameter.
template <class Model>
std::vector<walked_parameter> held_parameters(Model& model) {
  std::vector<walked_parameter> held;
  sw::for_each_parameter(model, [&](auto const&, auto const& p) {
    using P = std::remove_cvref_t<decltype(p)>;
    held.push_back({static_cast<std::size_t>(p.value->size()), static_cast<std::size_t>(p.value->rows()),
                    sw::is_partial_v<typename P::grad_placement>, p.copies > 1});
  });
  return held;
}

/// What a cost walk (fn -> calls fn(sw::parameter_cost) per parameter) states.
template <class Walk>
std::vector<walked_parameter> walked_parameters(Walk&& walk) {
  std::vector<walked_parameter> walked;
  walk([&](sw::parameter_cost const& p) {
    walked.push_back({p.elements, p.rows, p.partial_gradient, p.copies_elements != 0});
  });
  return walked;
}

/// The cost model's walk of a model's parameters (sw::parameter_costs over the model's shapes) against the
/// parameters the model holds after parallelize over every rank as tp: Llama (a vocabulary tp 4 pads, key-value
/// heads repeated at tp 4, tied and untied), GPT-2 (biases, LayerNorms, a tied head) and each Llama stage.
template <bool SequenceParallel, class World>
void check_parameter_walks(World const& world) {
  auto const tp = sw::make_mesh<"tp">(world, {world.size()});
  sw::cost_inputs const s{8, static_cast<std::size_t>(tp.size()), static_cast<std::size_t>(tp.rank()), "tp"};
  models::LlamaConfig m;
  m.vocabulary = 66, m.dim = 32, m.layers = 4, m.heads = 4, m.kv_heads = 2, m.hidden = 64, m.sequence = 8;
  for (bool tied : {false, true}) {
    m.tie_word_embeddings = tied;
    using Model = models::Llama<float, models::llama_plan<SequenceParallel, true>>;
    Model model(m);
    sw::parallelize(model, tp);
    INFO("Llama at tp ", tp.size(), std::string_view(tied ? ", tied" : ""),
         std::string_view(SequenceParallel ? ", sequence parallel" : ""));
    CHECK(walked_parameters([&](auto&& fn) { Model::shardwise_parameter_costs(m, s, fn); }) == held_parameters(model));
    using Stage = models::LlamaStage<float, models::llama_plan<SequenceParallel, true>>;
    sw::stage_split const split(m.layers, 2);  // blocks 0-1 with the embedding, 2-3 with the norm and output
    for (int stage = 0; stage < 2; ++stage) {
      Stage chunk(m, split, stage);
      sw::parallelize(chunk, tp);
      INFO("stage ", stage);
      CHECK(walked_parameters([&](auto&& fn) { Stage::shardwise_parameter_costs(m, split.of(stage), s, fn); }) ==
            held_parameters(chunk));
    }
  }
  using GPT2 = models::GPT2<float, models::gpt2_plan<SequenceParallel>>;
  models::GPT2Config g;
  g.vocabulary = 66, g.dim = 32, g.layers = 2, g.heads = 4, g.sequence = 6;
  GPT2 gpt2(g);
  sw::parallelize(gpt2, tp);
  INFO("GPT-2 at tp ", tp.size());
  CHECK(walked_parameters([&](auto&& fn) { GPT2::shardwise_parameter_costs(g, s, fn); }) == held_parameters(gpt2));
}

/// One block at the world's size as tp, sequence parallel or not: forward and backward recorded against the
/// block's declared cost, the held bytes against its parameters, and the results against the unsharded block.
template <class T, bool SequenceParallel, class World>
void check_block(World const& world, models::LlamaConfig const& c, std::size_t sequences) {
  using Plan = block_plan<SequenceParallel>;
  using Stream = std::conditional_t<SequenceParallel, sw::Shard<0>, sw::Replicate>;
  using Block = models::LlamaBlock<T, sw::subplan<Plan, "layers.*">>;
  auto const tokens = static_cast<Eigen::Index>(sequences * c.sequence);
  auto const x = random_matrix<T>(tokens, static_cast<Eigen::Index>(c.dim), 1);
  auto const dy = random_matrix<T>(tokens, static_cast<Eigen::Index>(c.dim), 2);
  OneBlock<T, sw::serial_plan> serial(c);
  auto const y0 = serial.layers[0].forward(sw::Activation<T>{x});
  auto const dx0 = serial.layers[0].backward(sw::Activation<T>{dy});

  auto counted = sw::counting(world);
  auto const tp = sw::make_mesh<"tp">(counted, {world.size()});
  OneBlock<T, Plan> model(c);
  sw::parallelize(model, tp);
  auto& block = model.layers[0];
  sw::cost_inputs const s{static_cast<std::size_t>(tokens), static_cast<std::size_t>(tp.size()),
                          static_cast<std::size_t>(tp.rank()), "tp"};
  sw::cost const predicted = sw::cost_of<Block>(c, s);
  auto const n = static_cast<std::size_t>(tokens);
  auto const rows = static_cast<Eigen::Index>(SequenceParallel ? sw::chunk_size(n, s.tp, s.tp_rank) : n);
  auto const first = static_cast<Eigen::Index>(SequenceParallel ? sw::chunk_offset(n, s.tp, s.tp_rank) : 0);
  INFO("tp ", tp.size(), ", rank ", tp.rank(), std::string_view(SequenceParallel ? ", sequence parallel" : ""),
       ", tokens ", tokens);

  counted.log().clear();
  auto const y = block.forward(sw::Activation<T, Stream>{x.middleRows(first, rows)});
  CHECK(held_activation_bytes(model) == predicted.activation_bytes);
  auto const forward_record = counted.log().entries();
  INFO("forward recorded:\n", listed(forward_record), "predicted:\n", predicted.forward);
  CHECK(forward_record == predicted.forward);
  counted.log().clear();
  auto const dx = block.backward(sw::Activation<T, Stream>{dy.middleRows(first, rows)});
  auto const backward_record = counted.log().entries();
  INFO("backward recorded:\n", listed(backward_record), "predicted:\n", predicted.backward);
  CHECK(backward_record == predicted.backward);

  auto const [parameters, gradients] = held_bytes(model);
  CHECK(parameters == predicted.parameter_bytes);
  CHECK(gradients == predicted.gradient_bytes);
  double const tolerance = std::is_same_v<T, double> ? 1e-12 : 1e-5;
  CHECK((y.local - y0.local.middleRows(first, rows)).cwiseAbs().maxCoeff() <= tolerance);
  CHECK((dx.local - dx0.local.middleRows(first, rows)).cwiseAbs().maxCoeff() <= tolerance);
}

/// Deterministic token ids and next-token targets for one microbatch of `sequences` sequences.
inline void tokens_for(models::LlamaConfig const& c, unsigned seed, std::size_t sequences,
                       std::vector<std::int64_t>& ids, std::vector<std::int64_t>& targets) {
  std::mt19937 rng(seed);
  ids.resize(sequences * c.sequence);
  targets.resize(ids.size());
  for (auto& id : ids) id = static_cast<std::int64_t>(rng() % c.vocabulary);
  for (std::size_t i = 0; i < ids.size(); ++i) targets[i] = (i + 1) % c.sequence == 0 ? -100 : ids[i + 1];
}

/// The sizes of a training step of `tokens` tokens per microbatch on this rank's tp and dp meshes.
template <class Tp, class Dp>
models::training_step_inputs step_inputs(std::size_t tokens, Tp const& tp, Dp const& dp, int microbatches, bool zero1) {
  return {{tokens, static_cast<std::size_t>(tp.size()), static_cast<std::size_t>(tp.rank()), "tp"},
          static_cast<std::size_t>(microbatches),
          static_cast<std::size_t>(dp.size()),
          static_cast<std::size_t>(dp.rank()),
          zero1,
          "dp"};
}

/// Two training steps of the Llama model on a dp x tp counting mesh: each step's record (forward, loss and
/// backward per microbatch, finish_gradients, AdamW's step) against models::llama_step_cost; the parameter and
/// gradient bytes held against the model's cost; the optimizer state against AdamW::state_bytes.
template <bool SequenceParallel, class World>
void check_training_step(World const& world, int dp_size, bool zero1, int microbatches, models::LlamaConfig const& c,
                         bool checkpointed = false) {
  using Plan = models::llama_plan<SequenceParallel>;
  using Model = models::Llama<float, Plan>;
  auto counted = sw::counting(world);
  auto const mesh = sw::make_mesh<"dp", "tp">(counted, {dp_size, world.size() / dp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  Model model(c);
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f, .zero1 = zero1});
  sw::parallelize(model, tp);
  std::size_t const per_micro = 4 / static_cast<std::size_t>(dp_size * microbatches);  // 4 sequences a step
  models::training_step_inputs const t = step_inputs(per_micro * c.sequence, tp, dp, microbatches, zero1);
  model.checkpoint_blocks(checkpointed);
  auto const predicted = models::llama_step_cost<float, Plan>(c, t, checkpointed);
  sw::cost const held = Model::shardwise_cost(c, t.tp, checkpointed);
  INFO("dp ", dp.size(), " x tp ", tp.size(), " (rank ", world.rank(), ")",
       std::string_view(SequenceParallel ? ", sequence parallel" : ""), std::string_view(zero1 ? ", ZeRO-1" : ""), ", ",
       microbatches, " microbatches", std::string_view(checkpointed ? ", blocks checkpointed" : ""));
  std::vector<std::int64_t> ids, targets;
  for (int step = 0; step < 2; ++step) {
    counted.log().clear();
    for (int micro = 0; micro < microbatches; ++micro) {
      tokens_for(c, static_cast<unsigned>(100 * step + 10 * dp.rank() + micro), per_micro, ids, targets);
      auto const logits = model.forward(ids);
      if (step == 0 && micro == 0) CHECK(held_activation_bytes(model) == held.activation_bytes);
      auto result = models::llama_loss(tp, logits, targets, c.vocabulary);
      model.backward(result.dlogits);
    }
    optimizer.step(sw::finish_gradients(model), dp);
    auto const record = counted.log().entries();
    INFO("step ", step, " recorded:\n", listed(record), "predicted:\n", predicted);
    CHECK(record == predicted);
    sw::zero_grad(model);
  }
  auto const [parameters, gradients] = held_bytes(model);
  CHECK(parameters == held.parameter_bytes);
  CHECK(gradients == held.gradient_bytes);
  auto const walk = [&](auto&& fn) { Model::shardwise_parameter_costs(c, t.tp, fn); };
  CHECK(optimizer.state_elements() * sizeof(float) == sw::AdamW<float>::state_bytes(walk, zero1, t.dp, t.dp_rank));
}

/// Two training steps of the Llama model cut over cp on a dp x cp x tp counting mesh (tp: the rest of the world):
/// each step's record (the ring's or the all-to-all's transfers on "cp" within each block, AdamW's gradient
/// reduction over dp x cp as one "data" axis) against models::llama_step_cost with the cp axis in its inputs; the
/// activations the model keeps against its cost.
template <bool SequenceParallel, class World>
void check_context_step(World const& world, int dp_size, int cp_size, sw::context_method method,
                        models::LlamaConfig const& c) {
  using Plan = models::llama_plan<SequenceParallel>;
  using Model = models::Llama<float, Plan>;
  auto counted = sw::counting(world);
  int const tp_size = world.size() / (dp_size * cp_size);
  auto const mesh = sw::make_mesh<"dp", "cp", "tp">(counted, {dp_size, cp_size, tp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const cp = sw::submesh<"cp">(mesh);
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(counted, {dp_size * cp_size, tp_size}));
  Model model(c);
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  sw::parallelize(model, tp);
  auto const context = sw::context_parallelize(model, cp, {c.sequence, cp_size}, method);
  std::size_t const per_rank = 4 / static_cast<std::size_t>(dp_size);  // 4 sequences a step
  models::training_step_inputs t = step_inputs(per_rank * context->tokens(), tp, data, 1, false);
  t.tp.cp = {static_cast<std::size_t>(cp_size), static_cast<std::size_t>(cp.rank()), c.sequence, true, method};
  t.dp_axis = "data";
  auto const predicted = models::llama_step_cost<float, Plan>(c, t);
  sw::cost const held = Model::shardwise_cost(c, t.tp);
  INFO("dp ", dp_size, " x cp ", cp_size, " x tp ", tp_size, " (rank ", world.rank(), "), sequence ", c.sequence,
       std::string_view(method == sw::context_method::ring ? ", ring" : ", all-to-all"),
       std::string_view(SequenceParallel ? ", sequence parallel" : ""));
  std::vector<std::int64_t> ids, targets, my_ids, my_targets;
  for (int step = 0; step < 2; ++step) {
    counted.log().clear();
    tokens_for(c, static_cast<unsigned>(100 * step + 10 * (world.rank() / (cp_size * tp_size))), per_rank, ids,
               targets);
    my_ids = context->my_tokens(ids), my_targets = context->my_tokens(targets);
    auto const logits = model.forward(my_ids);
    if (step == 0) CHECK(held_activation_bytes(model) == held.activation_bytes);
    auto result = models::llama_loss(tp, logits, my_targets, c.vocabulary);
    result.dlogits.local *= static_cast<float>(context->mean_weight());
    model.backward(result.dlogits);
    optimizer.step(sw::finish_gradients(model), data);
    auto const record = counted.log().entries();
    INFO("step ", step, " recorded:\n", listed(record), "predicted:\n", predicted);
    CHECK(record == predicted);
    sw::zero_grad(model);
  }
}

/// One pipeline step of the Llama stages over `pp`, a microbatch per entry of `ids`, the loss on the last stage
/// (the mean over the microbatches).
template <class Schedule, class Pp, class Tp, class Stages>
void run_llama_pipeline_step(Pp const& pp, Tp const& tp, Stages& stage,
                             std::vector<std::vector<std::int64_t>> const& ids,
                             std::vector<std::vector<std::int64_t>> const& targets, sw::pipeline_options options = {}) {
  int const microbatches = static_cast<int>(ids.size());
  sw::run_pipeline_step(
      Schedule{}, pp, std::span(stage), microbatches,
      [&](int m) { return std::span<const std::int64_t>(ids[static_cast<std::size_t>(m)]); },
      [&](int m, auto const& h) {
        return stage.back().head_loss(tp, h, targets[static_cast<std::size_t>(m)], 1.0f / float(microbatches)).gradient;
      },
      options);
}

/// One pipeline step of the Llama model in stages over every rank of `world` as the pp axis (tp and dp of size
/// 1): the pp record against sw::pipeline_step_cost, followed by the optimizer's clipping all-reduce over pp.
template <class Schedule, class World>
void check_pipeline_step(World const& world, int microbatches, models::LlamaConfig const& c) {
  auto counted = sw::counting(world);
  auto const pp = sw::make_mesh<"pp">(counted, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  auto const dp = sw::make_mesh<"dp">(sw::serial_world(), {1});
  sw::stage_chunks<models::LlamaStage<float>> stage;
  int const chunks = Schedule::chunks_per_rank;
  sw::stage_split const split(c.layers, pp.size() * chunks);
  auto const shape = sw::shape_of<Schedule>(pp.size(), microbatches);  // the loop placement, or ZBV's V
  for (int k = 0; k < chunks; ++k) stage.emplace_back(c, split, shape.stage_of(pp.rank(), k));
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  std::vector<std::vector<std::int64_t>> ids(static_cast<std::size_t>(microbatches)), targets(ids.size());
  for (std::size_t m = 0; m < ids.size(); ++m) tokens_for(c, static_cast<unsigned>(m), 1, ids[m], targets[m]);
  counted.log().clear();
  run_llama_pipeline_step<Schedule>(pp, tp, stage, ids, targets);
  optimizer.step(sw::finish_gradients(stage), dp, pp);
  auto const record = counted.log().entries();
  // One sequence per microbatch: the boundary is c.sequence rows of c.dim floats, whole on this rank.
  auto predicted =
      sw::pipeline_step_cost(Schedule{}, pp.size(), pp.rank(), microbatches, c.sequence * c.dim * sizeof(float));
  predicted.add(sw::transfer_kind::all_reduce, "pp", sizeof(float));  // the squared norms of the stages, summed
  INFO("pp ", pp.size(), " (rank ", pp.rank(), "), ", microbatches, " microbatches, ", chunks, " chunks per rank\n",
       "recorded:\n", listed(record), "predicted:\n", predicted);
  CHECK(record == predicted);
}

/// One training step of the Llama model under sw::fully_shard (each block a unit) over every rank of `world` as
/// dp, with `microbatches` passes: the dp record against models::llama_fsdp_step_cost.
template <class Strategy, class World>
void check_fsdp_step(World const& world, int microbatches, models::LlamaConfig const& c) {
  auto counted = sw::counting(world);
  auto const dp = sw::make_mesh<"dp">(counted, {world.size()});
  auto const tp = sw::make_mesh<"tp">(sw::serial_world(), {1});
  models::Llama<float> model(c);
  auto sharded = sw::fully_shard<sw::fsdp_policy<Strategy, sw::wrap_paths<"layers.*">>>(model, dp);
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  std::vector<std::int64_t> ids, targets;
  counted.log().clear();
  for (int m = 0; m < microbatches; ++m) {
    tokens_for(c, static_cast<unsigned>(10 * dp.rank() + m), 1, ids, targets);
    auto result = models::llama_loss(tp, sharded.forward(ids), targets, c.vocabulary);
    sharded.backward(result.dlogits);
  }
  optimizer.step(sharded);
  auto const record = counted.log().entries();
  auto const predicted = models::llama_fsdp_step_cost<float, Strategy>(c, static_cast<std::size_t>(dp.size()),
                                                                       static_cast<std::size_t>(dp.rank()),
                                                                       static_cast<std::size_t>(microbatches));
  INFO("dp ", dp.size(), " (rank ", dp.rank(), "), ", microbatches, " microbatches\nrecorded:\n", listed(record),
       "predicted:\n", predicted);
  CHECK(record == predicted);
}

/// One pipeline step of the Llama model in stages on a dp x pp x tp counting mesh, the stages given to
/// sw::parallelize over tp, then AdamW's step over dp and pp: the record of every axis, in order, against
/// sw::pipeline_step_cost with each stage's declared transfers (LlamaStage::shardwise_cost), then
/// sw::finish_gradients_cost and AdamW::step_cost over the stage's parameters.
struct pipeline_setup {
  bool zero1 = false;         ///< AdamW with ZeRO-1 over dp.
  bool checkpointed = false;  ///< Each block checkpointed.
  bool recomputed = false;    ///< Stage-level recomputation (stage_activations::recompute).
  bool tied = false;          ///< tie_word_embeddings across the stages.
  int cp = 1;                 ///< Each stage's sequences cut over cp ranks (ring); AdamW over dp x cp.
};

template <class Schedule, bool SequenceParallel, class World>
void check_pipeline_tp_step(World const& world, int dp_size, int pp_size, int microbatches, models::LlamaConfig c,
                            pipeline_setup const& o = {}) {
  bool const zero1 = o.zero1, checkpointed = o.checkpointed;
  c.tie_word_embeddings = o.tied;
  using Stage = models::LlamaStage<float, models::llama_plan<SequenceParallel>>;
  auto counted = sw::counting(world);
  int const tp_size = world.size() / (dp_size * pp_size * o.cp);
  auto const mesh = sw::make_mesh<"pp", "dp", "cp", "tp">(counted, {pp_size, dp_size, o.cp, tp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const pp = sw::submesh<"pp">(mesh);
  auto const cp = sw::submesh<"cp">(mesh);
  auto const data = sw::submesh<"data">(sw::make_mesh<"pp", "data", "tp">(counted, {pp_size, dp_size * o.cp, tp_size}));
  sw::stage_split const split(c.layers, pp.size());
  sw::stage_chunks<Stage> stage;
  stage.emplace_back(c, split, pp.rank());
  stage.back().checkpoint_blocks(checkpointed);
  sw::parallelize(stage, tp);
  std::shared_ptr<sw::context_parallel const> context;
  if (o.cp > 1) context = sw::context_parallelize(stage.back(), cp, {c.sequence, o.cp});
  std::size_t const rows_per_sequence = context ? context->tokens() : c.sequence;
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f, .zero1 = zero1});
  std::vector<std::vector<std::int64_t>> ids(static_cast<std::size_t>(microbatches)), targets(ids.size());
  for (std::size_t m = 0; m < ids.size(); ++m) {
    tokens_for(c, static_cast<unsigned>(10 * mesh.template coordinate<"dp">() + m), 1, ids[m], targets[m]);
    if (context) ids[m] = context->my_tokens(ids[m]), targets[m] = context->my_tokens(targets[m]);
  }
  counted.log().clear();
  run_llama_pipeline_step<Schedule>(pp, tp, stage, ids, targets,
                                    {o.recomputed ? sw::stage_activations::recompute : sw::stage_activations::keep});
  optimizer.step(sw::finish_gradients(stage), data, pp);
  auto const record = counted.log().entries();
  sw::cost_inputs s{rows_per_sequence, static_cast<std::size_t>(tp.size()), static_cast<std::size_t>(tp.rank()), "tp"};
  if (context) s.cp = {static_cast<std::size_t>(o.cp), static_cast<std::size_t>(cp.rank()), c.sequence};
  sw::stage_range const blocks = split.of(pp.rank());
  sw::cost const chunk = Stage::shardwise_cost(c, blocks, s, checkpointed);
  std::size_t const rows = SequenceParallel ? s.local_tokens() : s.tokens;  // the stream crossing stages
  auto predicted =
      sw::pipeline_step_cost(Schedule{}, pp.size(), pp.rank(), microbatches, rows * c.dim * sizeof(float),
                             Stage::shardwise_pipeline_transfers(c, blocks, s, checkpointed, o.recomputed));
  auto const walk = [&](auto&& fn) { Stage::shardwise_parameter_costs(c, blocks, s, fn); };
  predicted.append(sw::finish_gradients_cost(walk, s));
  predicted.append(sw::AdamW<float>::step_cost(walk, zero1, static_cast<std::size_t>(data.size()),
                                               static_cast<std::size_t>(data.rank()), s, "data", "pp"));
  INFO("dp ", dp_size, " x pp ", pp.size(), " x cp ", o.cp, " x tp ", tp.size(), " (rank ", world.rank(), ")",
       std::string_view(SequenceParallel ? ", sequence parallel" : ""), std::string_view(zero1 ? ", ZeRO-1" : ""),
       std::string_view(checkpointed ? ", blocks checkpointed" : ""),
       std::string_view(o.recomputed ? ", recomputed" : ""), std::string_view(o.tied ? ", tied" : ""), ", ",
       microbatches, " microbatches\nrecorded:\n", listed(record), "predicted:\n", predicted);
  CHECK(record == predicted);
  auto const [parameters, gradients] = held_bytes(stage.back());  // after the step: every gradient allocated
  CHECK(parameters == chunk.parameter_bytes);
  CHECK(gradients == chunk.gradient_bytes);
}

/// One pipeline step of Llama stages under FSDP (sw::run_pipeline_step over sw::fully_shard of each rank's stage,
/// each block a unit) on a dp 2 x pp 2 x tp counting mesh, then AdamW::step(sharded, pp): the record of every
/// axis, in order, against models::llama_fsdp_pipeline_step_cost.
template <class Schedule, bool SequenceParallel, class World>
void check_fsdp_pipeline_step(World const& world, int microbatches, models::LlamaConfig c,
                              sw::sharded_gradient_reduction reduction, bool tied = false) {
  using Plan = models::llama_plan<SequenceParallel>;
  c.tie_word_embeddings = tied;
  auto counted = sw::counting(world);
  auto const mesh = sw::make_mesh<"dp", "pp", "tp">(counted, {2, 2, world.size() / 4});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const pp = sw::submesh<"pp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  sw::stage_split const split(c.layers, pp.size());
  sw::stage_chunks<models::LlamaStage<float, Plan>> stage;
  stage.emplace_back(c, split, pp.rank());
  sw::parallelize(stage, tp);
  auto sharded = sw::fully_shard<sw::fsdp_policy<sw::full_shard, sw::wrap_paths<"layers.*">>>(stage, dp);
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  std::vector<std::vector<std::int64_t>> ids(static_cast<std::size_t>(microbatches)), targets(ids.size());
  for (std::size_t m = 0; m < ids.size(); ++m)
    tokens_for(c, static_cast<unsigned>(10 * dp.rank() + m), 1, ids[m], targets[m]);
  counted.log().clear();  // after fully_shard's own agreement and broadcasts
  sw::run_pipeline_step(
      Schedule{}, pp, sharded, microbatches,
      [&](int m) { return std::span<const std::int64_t>(ids[static_cast<std::size_t>(m)]); },
      [&](int m, auto const& h) {
        return stage.back().head_loss(tp, h, targets[static_cast<std::size_t>(m)], 1.0f / float(microbatches)).gradient;
      },
      {.sharded_gradients = reduction});
  optimizer.step(sharded, pp);
  auto const record = counted.log().entries();
  auto const t = step_inputs(c.sequence, tp, dp, microbatches, false);
  auto const predicted = models::llama_fsdp_pipeline_step_cost<float, Plan>(
      Schedule{}, c, split.of(pp.rank()), pp.size(), pp.rank(), microbatches, t, reduction);
  INFO("FSDP dp 2 x pp 2 x tp ", tp.size(), " (rank ", world.rank(), "), ", microbatches, " microbatches, reduced ",
       std::string_view(reduction == sw::sharded_gradient_reduction::every_microbatch ? "every microbatch"
                                                                                      : "at the end"),
       std::string_view(tied ? ", tied" : ""), "\nrecorded:\n", listed(record), "predicted:\n", predicted);
  CHECK(record == predicted);
}

/// One training step of the Llama model under sw::fully_shard (each block a unit) on a (replicate x) dp x tp
/// counting mesh, the model given to sw::parallelize over tp first, with `microbatches` passes and the options
/// `o` says (prefetch, checkpointed blocks, hybrid replicas): the record of every axis, in order, against
/// models::llama_fsdp_step_cost.
template <class Strategy, bool SequenceParallel, class Precision = sw::full_precision,
          class Wrap = sw::wrap_paths<"layers.*">, class World>
void check_fsdp_tp_step(World const& world, int dp_size, int microbatches, models::LlamaConfig const& c,
                        models::fsdp_cost_options const& o = {}) {
  using Plan = models::llama_plan<SequenceParallel>;
  using Policy = sw::fsdp_policy<Strategy, Wrap, Precision>;
  int const replicas = static_cast<int>(o.replicate), data = dp_size * replicas;
  auto counted = sw::counting(world);
  auto const mesh = sw::make_mesh<"replicate", "dp", "tp">(counted, {replicas, dp_size, world.size() / data});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const dp = sw::submesh<"dp">(mesh);
  models::Llama<float, Plan> model(c);
  model.checkpoint_blocks(o.checkpointed_blocks);
  sw::parallelize(model, tp);
  sw::fsdp_options const options{.min_num_params = o.min_num_params,
                                 .forward_prefetch = o.forward_prefetch,
                                 .backward_prefetch = o.backward_prefetch};
  sw::AdamW<float> optimizer({.learning_rate = 3e-3f, .max_grad_norm = 1.0f});
  std::size_t const per_micro = 4 / static_cast<std::size_t>(data * microbatches);  // 4 sequences a step
  models::training_step_inputs const t = step_inputs(per_micro * c.sequence, tp, dp, microbatches, false);
  auto const step = [&](auto&& sharded) {
    std::vector<std::int64_t> ids, targets;
    counted.log().clear();
    for (int m = 0; m < microbatches; ++m) {
      tokens_for(c, static_cast<unsigned>(10 * dp.rank() + m), per_micro, ids, targets);
      auto result = models::llama_loss(tp, sharded.forward(ids), targets, c.vocabulary);
      sharded.backward(result.dlogits);
    }
    optimizer.step(sharded);
  };
  if (replicas > 1) {
    if constexpr (!std::is_same_v<Strategy, sw::no_shard>)
      step(sw::fully_shard<Policy>(model, dp, sw::submesh<"replicate">(mesh), options));
  } else {
    step(sw::fully_shard<Policy>(model, dp, options));
  }
  auto const record = counted.log().entries();
  auto const predicted = models::llama_fsdp_step_cost<float, Strategy, Plan, Precision>(c, t, o);
  INFO("FSDP ", replicas, " x dp ", dp.size(), " x tp ", tp.size(), " (rank ", world.rank(), ")",
       std::string_view(SequenceParallel ? ", sequence parallel" : ""), ", ", microbatches, " microbatches",
       std::string_view(o.forward_prefetch ? ", prefetch" : ""),
       std::string_view(o.checkpointed_blocks ? ", blocks checkpointed" : ""),
       std::string_view(std::is_same_v<Precision, sw::full_precision> ? "" : ", mixed precision"), ", wrap ",
       static_cast<int>(o.wrap), " (min ", o.min_num_params, ")\nrecorded:\n", listed(record), "predicted:\n",
       predicted);
  CHECK(record == predicted);
}

/// One training step of the GPT-2 model on a dp x cp x tp counting mesh (cp 1 but when given: then 9-token sequences,
/// cut unevenly at cp 2), as the GPT-2 tests train it (AdamW with parameter groups, the gradients reduced over
/// dp x cp as one "data" axis): its record against the model's cost (forward, loss, backward, the attention's
/// transfers on "cp"), finish_gradients_cost and AdamW::step_cost; the held parameter, gradient and activation
/// bytes against the model's cost.
template <bool SequenceParallel, class World>
void check_gpt2_step(World const& world, int dp_size, bool zero1, int cp_size = 1,
                     sw::context_method method = sw::context_method::ring) {
  using Model = models::GPT2<float, models::gpt2_plan<SequenceParallel>>;
  models::GPT2Config c;
  c.vocabulary = 66, c.dim = 32, c.layers = 2, c.heads = 4, c.sequence = cp_size > 1 ? 9 : 6;  // 66, 6: padded at tp 4
  auto counted = sw::counting(world);
  int const tp_size = world.size() / (dp_size * cp_size);
  auto const mesh = sw::make_mesh<"dp", "cp", "tp">(counted, {dp_size, cp_size, tp_size});
  auto const tp = sw::submesh<"tp">(mesh);
  auto const cp = sw::submesh<"cp">(mesh);
  auto const data = sw::submesh<"data">(sw::make_mesh<"data", "tp">(counted, {dp_size * cp_size, tp_size}));
  Model model(c);
  sw::parallelize(model, tp);
  std::shared_ptr<sw::context_parallel const> context;
  if (cp_size > 1) context = sw::context_parallelize(model, cp, {c.sequence, cp_size}, method);
  sw::AdamW<float> optimizer(
      {.learning_rate = 1e-3f,
       .weight_decay = 0.1f,
       .max_grad_norm = 1.0f,
       .zero1 = zero1,
       .groups = {{.matches = sw::names_matching({"*.bias", "*ln_*.weight"}), .weight_decay = 0.0f}}});
  std::size_t const sequences = 4 / static_cast<std::size_t>(dp_size);
  std::size_t const rows = context ? context->tokens() : c.sequence;
  sw::cost_inputs s{sequences * rows, static_cast<std::size_t>(tp.size()), static_cast<std::size_t>(tp.rank()), "tp"};
  if (context)
    s.cp = {static_cast<std::size_t>(cp_size), static_cast<std::size_t>(cp.rank()), c.sequence, true, method};
  sw::cost const pass = Model::shardwise_cost(c, s);
  using Logits = typename decltype(std::declval<Model&>().lm_head)::output_layout;
  auto const walk = [&](auto&& fn) { Model::shardwise_parameter_costs(c, s, fn); };
  sw::transfer_list<256> predicted;
  predicted.append(pass.forward).append(sw::cross_entropy_cost<float, Logits>(s.tokens, s).forward);
  predicted.append(pass.backward).append(sw::finish_gradients_cost<256>(walk, s));
  predicted.append(sw::AdamW<float>::template step_cost<256>(walk, zero1, static_cast<std::size_t>(data.size()),
                                                             static_cast<std::size_t>(data.rank()), s, "data"));
  std::vector<std::int64_t> ids, targets;
  int const dp_rank = mesh.template coordinate<"dp">();
  for (std::size_t b = 0; b < sequences; ++b)
    for (std::size_t t = 0; t < rows; ++t) {
      std::size_t const i = b * c.sequence + (context ? static_cast<std::size_t>(context->positions()[t]) : t);
      ids.push_back(std::int64_t((i * 7 + 3 * static_cast<std::size_t>(dp_rank)) % c.vocabulary));
      targets.push_back((ids.back() + 1) % std::int64_t(c.vocabulary));
    }
  counted.log().clear();
  auto const logits = model.forward(ids);
  CHECK(held_activation_bytes(model) == pass.activation_bytes);
  auto result = models::gpt2_loss(tp, logits, targets, c.vocabulary);
  if (context) result.dlogits.local *= static_cast<float>(context->mean_weight());
  model.backward(result.dlogits);
  optimizer.step(sw::finish_gradients(model), data);
  auto const record = counted.log().entries();
  INFO("GPT-2 dp ", dp_size, " x cp ", cp_size, " x tp ", tp.size(), " (rank ", world.rank(), ")",
       std::string_view(SequenceParallel ? ", sequence parallel" : ""), std::string_view(zero1 ? ", ZeRO-1" : ""),
       std::string_view(method == sw::context_method::ring ? "" : ", all-to-all"), "\nrecorded:\n", listed(record),
       "predicted:\n", predicted);
  CHECK(record == predicted);
  auto const [parameters, gradients] = held_bytes(model);
  CHECK(parameters == pass.parameter_bytes);
  CHECK(gradients == pass.gradient_bytes);
  CHECK(optimizer.state_elements() * sizeof(float) ==
        sw::AdamW<float>::state_bytes(walk, zero1, static_cast<std::size_t>(data.size()),
                                      static_cast<std::size_t>(data.rank())));
}

/// Every case at the world's size.
template <class World>
void run_cost_cases(World const& world) {
  models::LlamaConfig c;
  c.dim = 32, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 6;
  check_parameter_walks<false>(world);
  check_parameter_walks<true>(world);
  check_block<double, false>(world, c, 2);
  check_block<double, true>(world, c, 2);
  check_block<float, true>(world, c, 3);  // 18 tokens: uneven sequence pieces at 4 ranks
  if (world.size() == 4) {                // more ranks than key-value heads: each repeated (kv_size_multiplier 2)
    check_block<double, false>(world, c, 1);
  }
  // The training steps of the Llama tests: TP, TP + SP with microbatches, dp with ZeRO-1 and without, dp x tp
  // with ZeRO-1 and microbatches; a vocabulary of 66, which tp 4 pads; kv heads repeated at tp 4.
  models::LlamaConfig m;
  m.vocabulary = 66, m.dim = 32, m.layers = 2, m.heads = 4, m.kv_heads = 2, m.hidden = 64, m.sequence = 8;
  int const n = world.size();
  check_training_step<false>(world, 1, false, 1, m);
  check_training_step<true>(world, 1, false, 2, m);
  check_training_step<true>(world, n, true, 1, m);
  check_training_step<false>(world, n, false, 1, m);
  check_training_step<true>(world, 1, false, 1, m, true);  // activation checkpointing: blocks recomputed
  check_training_step<false>(world, n, false, 1, m, true);
  if (n == 4) check_training_step<true>(world, 2, true, 2, m);
  // Cut over cp: by ring at cp 2 and cp 4 (with a sequence of 9: uneven pieces), by all-to-all; cp x tp with
  // sequence parallelism, cp x dp.
  if (n >= 2) {
    auto nine = m;
    nine.sequence = 9;
    check_context_step<false>(world, 1, 2, sw::context_method::ring, m);
    check_context_step<false>(world, 1, 2, sw::context_method::ring, nine);
    if (n == 2) check_context_step<false>(world, 1, 2, sw::context_method::all_to_all, nine);  // tp 1: kv heads divide
  }
  if (n == 4) {
    auto nine = m;
    nine.sequence = 9;
    check_context_step<false>(world, 1, 4, sw::context_method::ring, nine);
    check_context_step<true>(world, 1, 2, sw::context_method::ring, m);
    check_context_step<false>(world, 2, 2, sw::context_method::all_to_all, m);
  }
  // The GPT-2 model as its tests train it: tp over every rank, with and without sequence parallelism; dp 2 x tp 2
  // with ZeRO-1.
  check_gpt2_step<false>(world, 1, false);
  check_gpt2_step<true>(world, 1, false);
  if (n == 4) check_gpt2_step<true>(world, 2, true);
  // ... and cut over cp: by ring and (at 2 ranks) by all-to-all; cp 2 x tp 2 with sequence parallelism, dp 2 x cp 2.
  if (n >= 2) check_gpt2_step<false>(world, 1, false, 2);
  if (n == 2) check_gpt2_step<false>(world, 1, false, 2, sw::context_method::all_to_all);
  if (n == 4) check_gpt2_step<true>(world, 1, false, 2);
  if (n == 4) check_gpt2_step<false>(world, 2, true, 2);
  // Pipeline steps over every rank: 4 layers, so that interleaving (2 chunks per rank) has a layer per stage at 2.
  models::LlamaConfig p = m;
  p.layers = 4;
  check_pipeline_step<sw::GPipe>(world, 4, p);
  check_pipeline_step<sw::OneFOneB>(world, 4, p);
  check_pipeline_step<sw::ZeroBubbleH1>(world, 4, p);  // W sends nothing: 1F1B's messages
  if (n <= 2) check_pipeline_step<sw::Interleaved1F1B<2>>(world, 4, p);
  if (n <= 2) check_pipeline_step<sw::ZeroBubbleV>(world, 4, p);  // the V's turn on the last rank sends nothing
  // Stages cut over tp, as the pipeline tests train them: pp 2 x tp 2 (with sequence parallelism, without, with
  // checkpointed blocks, tied embeddings, stage-level recomputation), dp 2 x pp 2 with ZeRO-1; every rank as tp at
  // pp 1; and pp over every rank with the stages recomputed.
  if (n == 4) {
    check_pipeline_tp_step<sw::OneFOneB, true>(world, 1, 2, 4, p);
    check_pipeline_tp_step<sw::ZeroBubbleH1, true>(world, 1, 2, 4, p);  // every tp transfer in B, none in W
    check_pipeline_tp_step<sw::GPipe, true>(world, 1, 2, 3, p);
    check_pipeline_tp_step<sw::OneFOneB, false>(world, 1, 2, 2, p);
    check_pipeline_tp_step<sw::OneFOneB, true>(world, 1, 2, 3, p, {.checkpointed = true});
    check_pipeline_tp_step<sw::OneFOneB, true>(world, 2, 2, 2, p, {.zero1 = true});
    check_pipeline_tp_step<sw::OneFOneB, true>(world, 1, 2, 3, p, {.tied = true});
    check_pipeline_tp_step<sw::OneFOneB, true>(world, 1, 2, 3, p, {.recomputed = true});
    check_pipeline_tp_step<sw::GPipe, true>(world, 1, 2, 3, p, {.recomputed = true});
    auto p9 = p;  // each stage's sequences cut over cp 2, unevenly (5 and 4 tokens)
    p9.sequence = 9;
    check_pipeline_tp_step<sw::OneFOneB, false>(world, 1, 2, 3, p9, {.cp = 2});
    check_pipeline_tp_step<sw::ZeroBubbleH1, false>(world, 1, 2, 2, p9, {.cp = 2});
  }
  if (n == 4)  // FSDP within the stages: dp 2 x pp 2, both reductions, and tied embeddings
    for (auto reduction :
         {sw::sharded_gradient_reduction::every_microbatch, sw::sharded_gradient_reduction::end_of_step}) {
      check_fsdp_pipeline_step<sw::GPipe, true>(world, 2, p, reduction);
      check_fsdp_pipeline_step<sw::OneFOneB, true>(world, 3, p, reduction, true);
    }
  check_pipeline_tp_step<sw::OneFOneB, true>(world, 1, 1, 2, p);
  check_pipeline_tp_step<sw::OneFOneB, true>(world, 1, n, 4, p, {.recomputed = true});
  // FSDP over every rank (a vocabulary of 66: uneven rows at dp 4), one and two microbatches.
  check_fsdp_step<sw::full_shard>(world, 1, m);
  check_fsdp_step<sw::full_shard>(world, 2, m);
  check_fsdp_step<sw::shard_grad_op>(world, 2, m);
  check_fsdp_step<sw::no_shard>(world, 2, m);
  // FSDP x TP as the FSDP tests train it (dp 2 x tp 2, sequence parallel), and tp over every rank at dp 1; the
  // options the FSDP tests train with: prefetch, checkpointed blocks, bf16 gathers, hybrid replicas.
  using bf16_gathers = sw::mixed_precision<Eigen::bfloat16, float>;
  models::fsdp_cost_options const prefetch{.forward_prefetch = true, .backward_prefetch = true};
  models::fsdp_cost_options const checkpointed{.checkpointed_blocks = true};
  if (n == 4) {
    check_fsdp_tp_step<sw::full_shard, true>(world, 2, 1, m);
    check_fsdp_tp_step<sw::full_shard, false>(world, 2, 2, m);
    check_fsdp_tp_step<sw::shard_grad_op, true>(world, 2, 1, m);
    check_fsdp_tp_step<sw::no_shard, true>(world, 2, 1, m);
    check_fsdp_tp_step<sw::full_shard, true>(world, 2, 1, m, prefetch);
    check_fsdp_tp_step<sw::full_shard, true, bf16_gathers>(world, 2, 1, m);
    check_fsdp_tp_step<sw::full_shard, true>(world, 2, 1, m, {.replicate = 2});  // 2 replicas x dp 2 x tp 1
    check_fsdp_tp_step<sw::full_shard, true>(world, 2, 1, m, {.checkpointed_blocks = true});
    models::LlamaConfig tied = m, one_kv_head = m;
    tied.tie_word_embeddings = true;
    one_kv_head.kv_heads = 1;  // repeated over the 2 tp ranks: the copies' gradients summed
    check_fsdp_tp_step<sw::full_shard, true>(world, 2, 1, tied);
    check_fsdp_tp_step<sw::full_shard, true>(world, 2, 1, one_kv_head);
    models::fsdp_cost_options both = prefetch;  // a checkpointed block's forward runs before the next gather
    both.checkpointed_blocks = true;
    check_fsdp_tp_step<sw::full_shard, true>(world, 2, 1, m, both);
    // tp 4 over 2 key-value heads: each repeated, and fully_shard counts the copies (attention 4096 >= 4000).
    models::fsdp_cost_options const size_4000{.wrap = models::llama_fsdp_wrap::by_size, .min_num_params = 4000};
    check_fsdp_tp_step<sw::full_shard, true, sw::full_precision, sw::wrap_min_params>(world, 1, 1, m, size_4000);
    models::fsdp_cost_options prefetched_by_size = size_4000;  // prefetch among units of several kinds
    prefetched_by_size.forward_prefetch = prefetched_by_size.backward_prefetch = true;
    check_fsdp_tp_step<sw::full_shard, true, sw::full_precision, sw::wrap_min_params>(world, 1, 1, m,
                                                                                      prefetched_by_size);
  }
  check_fsdp_tp_step<sw::full_shard, true>(world, 1, 1, m);
  // The wrap policies the FSDP tests train with: by type (a unit per block, as by path), none (the root holds
  // everything), by size (3000: attention and feed-forward units; 5000: feed-forward units only).
  using block = models::Llama<float, models::llama_plan<true>>::block_type;
  using by_size = sw::wrap_min_params;
  models::fsdp_cost_options const size_3000{.wrap = models::llama_fsdp_wrap::by_size, .min_num_params = 3000};
  models::fsdp_cost_options const size_5000{.wrap = models::llama_fsdp_wrap::by_size, .min_num_params = 5000};
  models::fsdp_cost_options const whole{.wrap = models::llama_fsdp_wrap::none};
  if (n >= 2) {
    int const dp2 = 2;
    check_fsdp_tp_step<sw::full_shard, true, sw::full_precision, sw::wrap_type<block>>(world, dp2, 1, m);
    check_fsdp_tp_step<sw::full_shard, true, sw::full_precision, sw::wrap_none>(world, dp2, 1, m, whole);
    check_fsdp_tp_step<sw::full_shard, true, sw::full_precision, by_size>(world, dp2, 1, m, size_3000);
    check_fsdp_tp_step<sw::full_shard, true, sw::full_precision, by_size>(world, dp2, 2, m, size_5000);
    check_fsdp_tp_step<sw::shard_grad_op, false, sw::full_precision, by_size>(world, dp2, 1, m, size_3000);
    check_fsdp_tp_step<sw::no_shard, true, sw::full_precision, by_size>(world, dp2, 1, m, size_3000);
  }
  if (n == 2) {
    check_fsdp_tp_step<sw::full_shard, false>(world, 2, 2, m, prefetch);
    check_fsdp_tp_step<sw::shard_grad_op, false>(world, 2, 1, m, prefetch);
    check_fsdp_tp_step<sw::full_shard, false>(world, 2, 1, m, checkpointed);
    check_fsdp_tp_step<sw::full_shard, false, bf16_gathers>(world, 2, 2, m);
  }
}

}  // namespace cost_cases
