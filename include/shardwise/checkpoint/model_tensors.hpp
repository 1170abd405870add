#pragma once
// A model's tensors as checkpoint IO sees them, as a run-time table: each tensor's layout (name, element type,
// shapes, how tp cuts it) and a view of this rank's values. The walk that fills it is the one piece of checkpoint
// code compiled per model type; saving, loading, resharding and the Hugging Face mappings read the table, so
// their code is compiled once for every model a program holds (docs/build-time.md).
#include <Eigen/Core>
#include <cstddef>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/dtype.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"

namespace shardwise::detail {

/// This rank's values of one tensor: `rows` x `cols` elements of `type`, row-major, at `data` (a vector is
/// rows x 1). Valid while the walk that handed it out runs, or as long as the model when the table says so.
struct tensor_values {
  std::byte* data = nullptr;
  dtype type = dtype::F32;
  std::size_t rows = 0, cols = 0;

  [[nodiscard]] std::size_t elements() const { return rows * cols; }
  [[nodiscard]] std::size_t bytes() const { return elements() * dtype_size(type); }
  /// Zero in every floating type is all bits clear.
  void set_zero() const {
    if (bytes() != 0) std::memset(data, 0, bytes());
  }
};

/// The values of an Eigen matrix or vector (row-major storage, or one column).
template <class Dense>
tensor_values tensor_values_of(Dense& value) {
  using Plain = std::remove_cvref_t<Dense>;
  static_assert(Plain::IsRowMajor || Plain::ColsAtCompileTime == 1,
                "shardwise::checkpoint: a parameter's storage must be row-major (shardwise::nn::matrix)");
  using Scalar = typename Plain::Scalar;
  return {reinterpret_cast<std::byte*>(const_cast<std::remove_const_t<Scalar>*>(value.data())),
          dtype_of<std::remove_const_t<Scalar>>, static_cast<std::size_t>(value.rows()),
          static_cast<std::size_t>(value.cols())};
}

/// Calls fn(E{}) with E the C++ type of a floating dtype (double, float, float16, bfloat16).
template <class Fn>
decltype(auto) with_floating_type(dtype type, Fn&& fn) {
  switch (type) {
    case dtype::F64:
      return fn(double{});
    case dtype::F32:
      return fn(float{});
    case dtype::F16:
      return fn(float16{});
    case dtype::BF16:
      return fn(bfloat16{});
    default:
      fail("shardwise::checkpoint: a parameter of type ", dtype_name(type),
           " is not a floating type; parameters are double, float, float16 or bfloat16");
  }
}

/// The values as bytes, the form in which collectives move them whatever their type.
inline Eigen::Map<Eigen::Matrix<unsigned char, Eigen::Dynamic, 1>> bytes_of(tensor_values const& v) {
  return {reinterpret_cast<unsigned char*>(v.data), static_cast<Eigen::Index>(v.bytes())};
}

/// A model's tensors, walked at run time, and what checkpoint IO asks of the model beside them.
struct model_tensors {
  /// Called for each tensor with its layout and this rank's values.
  using visitor = std::function<void(tensor_layout const&, tensor_values const&)>;
  /// Walks every tensor as it lies on tp rank `rank` of `size`; with `materialize`, a lazily declared layer is
  /// allocated (this rank's shard) first, without, it is refused.
  std::function<void(int size, int rank, bool materialize, visitor const&)> walk;
  /// Whether the values outlive the walk (a model's parameters, or state a wrapper keeps): a save then borrows
  /// them; else (FSDP's shards) it copies them.
  bool values_outlive_walk = true;
  /// The configuration the model states (shardwise_config), which checkpoints record and loads compare.
  std::optional<std::map<std::string, std::string>> config;
  /// For a pipeline stage: whether a checkpoint tensor is another stage's (not this one's to read).
  std::function<bool(std::string_view)> other_stage;
  /// What the model needs of a checkpoint beyond its tensors (the optimizer state), checked before reading.
  std::function<void(checkpoint_index const&, std::string const&)> check_index;

  /// walk(size, rank, materialize, fn).
  void for_each(int size, int rank, bool materialize, visitor const& fn) const { walk(size, rank, materialize, fn); }
};

/// Hands each tensor's values to a table's visitor. A type of its own, not a lambda, so that the walk over a model's
/// list (for_each_listed_tensor) is compiled once per element type, not once per model type.
struct values_to_visitor {
  model_tensors::visitor const& fn;
  template <class Value>
  void operator()(tensor_layout const& t, Value& value) const {
    fn(t, tensor_values_of(value));
  }
};

/// The table of `model` (a module, a pipeline stage, FSDP's sharded model, or a wrapper with optimizer state),
/// which must outlive it.
template <class Model>
model_tensors tensors_of(Model& model) {
  model_tensors m;
  m.walk = [&model](int size, int rank, bool materialize, model_tensors::visitor const& fn) {
    for_each_checkpoint_tensor(model, size, rank, materialize, values_to_visitor{fn});
  };
  m.values_outlive_walk = !requires { model.shardwise_for_each_parameter_shard([](auto&&...) {}); } ||
                          requires { requires Model::shardwise_values_outlive_walk; };
  if constexpr (requires { model.shardwise_config(); }) m.config = model.shardwise_config();
  if constexpr (requires { model.shardwise_other_stage(std::string_view()); })
    m.other_stage = [&model](std::string_view name) { return model.shardwise_other_stage(name); };
  if constexpr (requires(checkpoint_index const& index) { model.shardwise_check_index(index, std::string()); })
    m.check_index = [&model](checkpoint_index const& index, std::string const& file) {
      model.shardwise_check_index(index, file);
    };
  return m;
}

}  // namespace shardwise::detail
