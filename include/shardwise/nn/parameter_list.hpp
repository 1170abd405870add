#pragma once
// A model's layers and parameters as a run-time list, built by one walk of the model's tree. finish_gradients,
// zero_grad and the optimizers run over the list, so their code is compiled once per element type, not once
// per model type: a program that trains a model under several plans walks each model's tree once
// (docs/history/design-issue-34.md, step 3).
#include <concepts>
#include <cstddef>
#include <string>
#include <string_view>
#include <tuple>
#include <type_traits>
#include <vector>

#include "shardwise/nn/layers/parameter.hpp"
#include "shardwise/placement/placement.hpp"
#include "shardwise/plan/module.hpp"

namespace shardwise::detail {

/// A parameter's value, gradient or pending partial sum, held as a matrix or as a vector of T by its layer.
template <class T>
struct tensor_slot {
  nn::matrix<T>* matrix = nullptr;
  nn::vector<T>* vector = nullptr;

  explicit operator bool() const { return matrix != nullptr || vector != nullptr; }
  [[nodiscard]] T* data() const { return matrix ? matrix->data() : vector->data(); }
  [[nodiscard]] std::size_t size() const { return static_cast<std::size_t>(matrix ? matrix->size() : vector->size()); }
  [[nodiscard]] Eigen::Index rows() const { return matrix ? matrix->rows() : vector->rows(); }
  [[nodiscard]] Eigen::Index cols() const { return matrix ? matrix->cols() : 1; }
  /// Zeros of `shape`'s size.
  void set_zero_as(tensor_slot const& shape) const {
    if (matrix)
      matrix->setZero(shape.rows(), shape.cols());
    else
      vector->setZero(shape.rows());
  }
};

template <class T>
tensor_slot<T> slot_of(nn::matrix<T>* m) {
  return {m, nullptr};
}
template <class T>
tensor_slot<T> slot_of(nn::vector<T>* v) {
  return {nullptr, v};
}

/// One parameter of the list: a sw::Parameter with its gradient's placement as a value instead of a type.
template <class T>
struct listed_parameter {
  tensor_slot<T> value, grad;
  tensor_slot<T> reduced_into;  // Partial gradients: where reduce() adds the sum (may be empty)
  bool partial = false;         // the gradient is Partial<Sum> until finished
  bool sharded = false;         // the gradient is Shard<d> over the group
  bool rows_sharded = false;    // Shard<0>: the layout of replicated blocks' copies
  nn::group<T> const* group = nullptr;
  std::size_t copies = 1, copy_block = 0;
  bool* copies_summed = nullptr;
  std::string_view mirror_of;
  bool frozen = false;  // sw::freeze: not trained (no gradient, no optimizer state, nothing to finish)
  expert_parallel const* placed_over = nullptr;  // an expert's placed over ep ranks (Parameter::placed_over)
  std::string name;                  // "layers.0.attention.wq.weight" when the list was built with names, else empty
  std::string_view leaf = "weight";  // its name within its layer
  bool is_vector = false;            // held as a vector (a bias, a norm's weight)
  int shard_dim = -1;                // the dimension tp cuts its value on (-1: replicated)
  std::size_t real_rows = 0;         // rows of the unsharded tensor that are the model's (0: all; see Parameter)

  /// The finished gradient: a Partial one's is where reduce() added the sum.
  [[nodiscard]] tensor_slot<T> finished_grad() const { return partial && reduced_into ? reduced_into : grad; }
  /// A gradient not allocated yet (a layer filled from a checkpoint, before backward) becomes zeros.
  void ensure_gradient() const {
    if (frozen) return;
    if (grad.size() != value.size()) grad.set_zero_as(value);
    if (reduced_into && reduced_into.size() != value.size()) reduced_into.set_zero_as(value);
  }
};

/// One layer of the list: the object, what the walks that need no layer type ask of it (each null where the layer
/// cannot do it), and its parameters, list.parameters[first_parameter, end_parameter) of the list as built.
struct listed_layer {
  void* layer = nullptr;
  void (*zero_grad)(void*) = nullptr;
  bool (*materialized)(void const*) = nullptr;  // null: always (a layer that cannot be declared lazily)
  void (*materialize)(void*) = nullptr;
  std::string_view tied_to;  // a weight tied to another layer's: the owner's path (else empty)
  std::string path;          // "layers.0.attention.wq" when the list was built with names, else empty
  std::size_t first_parameter = 0, end_parameter = 0;
};

/// A model's layers and their present parameters, in the order of sw::for_each_parameter.
template <class T>
struct model_list {
  std::vector<listed_layer> layers;
  std::vector<listed_parameter<T>> parameters;
};

/// What a list is built with: names cost a string per parameter; allocating gradients is what a step needs
/// (a lazily loaded layer has none before its first backward) and what a checkpoint's walk must not do.
struct list_options {
  bool names = false;
  bool allocate_gradients = false;
};

/// The element type of a model's parameters: its first layer's (float for a model without layers, whose list
/// is empty).
template <class... Ns>
struct first_layer_element {
  using type = float;
};
template <class N, class... Rest>
struct first_layer_element<N, Rest...> {
  static auto pick() {
    if constexpr (layer<N>)
      return std::type_identity<
          typename std::tuple_element_t<0, decltype(std::declval<N&>().parameters())>::tensor_type::Scalar>{};
    else
      return std::type_identity<typename first_layer_element<Rest...>::type>{};
  }
  using type = typename decltype(pick())::type;
};
template <class List>
struct first_layer_element_in;
template <class... Ns>
struct first_layer_element_in<type_list<Ns...>> : first_layer_element<Ns...> {};
template <class Model>
using model_element_t = typename first_layer_element_in<tree_nodes_t<Model>>::type;

/// A walk's path that is built only when the list wants names: one walk serves both.
struct list_path {
  std::string text;
  bool named = false;
};
inline list_path child_path(list_path const& prefix, std::string_view name) {
  if (!prefix.named) return {};
  return {child_path(prefix.text, name), true};
}
inline list_path child_path(list_path const& prefix, std::size_t index) {
  if (!prefix.named) return {};
  return {child_path(prefix.text, index), true};
}

template <class T, class Tensor, class G>
listed_parameter<T> list_entry(Parameter<Tensor, G> const& p, list_path const& path) {
  listed_parameter<T> entry;
  entry.value = slot_of(p.value), entry.grad = slot_of(p.grad);
  if (p.reduced_into) entry.reduced_into = slot_of(p.reduced_into);
  entry.partial = is_partial_v<G>;
  entry.sharded = is_shard_v<G>;
  entry.rows_sharded = std::is_same_v<G, Shard<0>>;
  entry.group = p.group;
  entry.copies = p.copies, entry.copy_block = p.copy_block;
  entry.copies_summed = p.copies_summed;
  entry.mirror_of = p.mirror_of;
  entry.frozen = is_frozen(p);
  entry.placed_over = p.placed_over;
  entry.leaf = p.leaf;
  entry.is_vector = Tensor::ColsAtCompileTime == 1;
  if constexpr (is_shard_v<G>)
    entry.shard_dim = G::dim < 0 ? G::dim + (Tensor::ColsAtCompileTime == 1 ? 1 : 2) : G::dim;
  entry.real_rows = p.real_rows;
  if (path.named) entry.name = path.text.empty() ? std::string(p.leaf) : path.text + "." + std::string(p.leaf);
  return entry;
}

template <class L>
void zero_grad_of(void* layer) {
  static_cast<L*>(layer)->zero_grad();
}
template <class L>
bool materialized_of(void const* layer) {
  return static_cast<L const*>(layer)->materialized();
}
template <class L>
void materialize_of(void* layer) {
  static_cast<L*>(layer)->shardwise_materialize();
}

/// Appends one layer and its present parameters to the list. Called with the layer's core (layer_core_t), so that
/// it is compiled once per core, not once per layer of every plan and model.
template <class T, class Core>
void list_layer(model_list<T>& list, Core& l, list_path const& path) {
  listed_layer entry;
  entry.layer = &l;
  if constexpr (requires { l.zero_grad(); }) entry.zero_grad = &zero_grad_of<Core>;
  if constexpr (requires { l.materialized(); }) entry.materialized = &materialized_of<Core>;
  if constexpr (requires { l.shardwise_materialize(); }) entry.materialize = &materialize_of<Core>;
  if constexpr (requires {
                  { l.tied() } -> std::convertible_to<bool>;
                  { l.tied_to() } -> std::convertible_to<std::string_view>;
                })
    if (l.tied()) entry.tied_to = l.tied_to();
  if (path.named) entry.path = path.text;
  entry.first_parameter = list.parameters.size();
  std::apply([&](auto const&... p) { ((p.present ? list.parameters.push_back(list_entry<T>(p, path)) : void()), ...); },
             l.parameters());
  entry.end_parameter = list.parameters.size();
  list.layers.push_back(std::move(entry));
}

template <class M>
inline constexpr bool is_model_list = false;
template <class T>
inline constexpr bool is_model_list<model_list<T>> = true;

/// The model's list: one walk of its tree, the only one finish_gradients, zero_grad and the optimizers compile.
template <class T, class Model>
  requires(!is_model_list<std::remove_cv_t<Model>>)  // a list is its own (below)
model_list<T> list_model(Model& model, list_options options) {
  model_list<T> list;
  auto on_layer = [&](auto& l, list_path const& path) {
    list_layer<T>(list, static_cast<layer_core_t<std::remove_cvref_t<decltype(l)>>&>(l), path);
  };
  auto on_module = skip_node;
  walk_tree(model, list_path{{}, options.names}, on_module, on_layer);
  if (options.allocate_gradients)
    for (auto const& p : list.parameters) p.ensure_gradient();
  return list;
}

/// A list already made is its own (a walk handed a model's list, such as the checkpoints' with_state, in place of
/// the model); it was made with the options it has.
template <class T>
model_list<T> list_model(model_list<T> const& list, list_options) {
  return list;
}

}  // namespace shardwise::detail
