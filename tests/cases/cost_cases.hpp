// A plan's cost (sw::cost) against what a counting mesh (sw::counting) records on a real run: the Llama
// attention, feed-forward and block under tensor parallelism with and without sequence parallelism, forward
// and backward, entry for entry (kind, axis, bytes, count, order), and the parameter and gradient bytes
// against the tensors the rank actually holds. Included by test_cost.cpp (threads) and test_mpi_cost.cpp (MPI):
// run_cost_cases(world) runs every case on the ranks of `world`.
#pragma once
#include <doctest/doctest.h>

#include <random>
#include <shardwise/mesh/counting.hpp>
#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_plan.hpp>
#include <shardwise/shardwise.hpp>
#include <sstream>
#include <string>
#include <tuple>
#include <type_traits>
#include <vector>

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

inline std::string listed(std::vector<sw::transfer> const& entries) {
  std::ostringstream out;
  for (auto const& t : entries) out << "  " << t << '\n';
  return out.str();
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
  INFO("tp ", tp.size(), ", rank ", tp.rank(), SequenceParallel ? ", sequence parallel" : "", ", tokens ", tokens);

  counted.log().clear();
  auto const y = block.forward(sw::Activation<T, Stream>{x.middleRows(first, rows)});
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

/// Every case at the world's size.
template <class World>
void run_cost_cases(World const& world) {
  models::LlamaConfig c;
  c.dim = 32, c.heads = 4, c.kv_heads = 2, c.hidden = 64, c.sequence = 6;
  check_block<double, false>(world, c, 2);
  check_block<double, true>(world, c, 2);
  check_block<float, true>(world, c, 3);  // 18 tokens: uneven sequence pieces at 4 ranks
  if (world.size() == 4) {                // more ranks than key-value heads: each repeated (kv_size_multiplier 2)
    check_block<double, false>(world, c, 1);
  }
}

}  // namespace cost_cases
