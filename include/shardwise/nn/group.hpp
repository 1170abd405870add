#pragma once
// The tensor-parallel group a layer talks to after parallelize. Layers are types of the model, not of the
// backend, so the mesh is held behind a small interface; one indirect call per collective costs nothing next
// to the collective, and the arithmetic around it stays the same code as without sharding.
#include <Eigen/Core>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>

#include "shardwise/adapters/eigen.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise::nn {

/// The tensor-parallel group a layer holds after parallelize: the 1-D mesh behind a small interface, so that a
/// layer's type does not depend on the backend.
template <class T>
class group {
 public:
  virtual ~group() = default;
  /// Ranks in the group.
  [[nodiscard]] virtual int size() const = 0;
  /// This rank's place in it.
  [[nodiscard]] virtual int rank() const = 0;
  /// The mesh axis's name ("tp"), for messages.
  [[nodiscard]] virtual std::string_view axis() const = 0;
  /// Reduces n elements in place, in rank order.
  virtual void all_reduce(T* data, std::size_t n, detail::op_kind op) const = 0;
  /// Concatenates every rank's `in` along `dim` (uneven pieces allowed) into `out`.
  virtual void all_gather(matrix<T> const& in, matrix<T>& out, int dim) const = 0;
  /// Sums `in` over the ranks and leaves this rank's torch.chunk piece along `dim` in `out`.
  virtual void reduce_scatter(matrix<T> const& in, matrix<T>& out, int dim) const = 0;
  /// Cuts `in` into the ranks' torch.chunk pieces along `split_dim`, sends piece j to rank j and concatenates what
  /// each rank sent along `concat_dim` into `out` (an activation cut along one dimension, re-cut along the other).
  virtual void all_to_all(matrix<T> const& in, matrix<T>& out, int split_dim, int concat_dim) const = 0;
  /// all_gather on bfloat16 values: for a style that moves activations in 16 bits (tests/test_custom_style.cpp).
  virtual void all_gather_bf16(matrix<Eigen::bfloat16> const& in, matrix<Eigen::bfloat16>& out, int dim) const = 0;

  /// Reduces a matrix in place.
  void all_reduce(matrix<T>& m, detail::op_kind op = detail::op_kind::sum) const {
    all_reduce(m.data(), static_cast<std::size_t>(m.size()), op);
  }
  /// Reduces a vector in place.
  void all_reduce(vector<T>& v, detail::op_kind op = detail::op_kind::sum) const {
    all_reduce(v.data(), static_cast<std::size_t>(v.size()), op);
  }
};

/// The group of a 1-D mesh of any backend (make_group builds it).
template <class Mesh, class T>
class group_of final : public group<T> {
 public:
  /// Keeps the mesh.
  explicit group_of(Mesh mesh) : mesh_(std::move(mesh)) {}
  /// See group.
  int size() const override { return mesh_.size(); }
  /// See group.
  int rank() const override { return mesh_.rank(); }
  /// See group.
  std::string_view axis() const override { return Mesh::names[0]; }
  /// See group.
  void all_reduce(T* data, std::size_t n, detail::op_kind op) const override {
    Eigen::Map<vector<T>> view(data, static_cast<Eigen::Index>(n));
    detail::all_reduce_on(mesh_.comm(0), view, op);
  }
  /// See group.
  void all_gather(matrix<T> const& in, matrix<T>& out, int dim) const override {
    detail::all_gather_on(mesh_.comm(0), in, out, dim);
  }
  /// See group.
  void all_gather_bf16(matrix<Eigen::bfloat16> const& in, matrix<Eigen::bfloat16>& out, int dim) const override {
    // Moved as bits: the backends' gathers of std::uint16_t are compiled once (SHARDWISE_SEPARATE_RUNTIME), not
    // in every file for Eigen's type.
    static_assert(sizeof(Eigen::bfloat16) == sizeof(std::uint16_t));
    matrix<std::uint16_t> bits(in.rows(), in.cols()), gathered;
    std::memcpy(bits.data(), in.data(), static_cast<std::size_t>(in.size()) * sizeof(std::uint16_t));
    detail::all_gather_on(mesh_.comm(0), bits, gathered, dim);
    out.resize(gathered.rows(), gathered.cols());
    std::memcpy(static_cast<void*>(out.data()), gathered.data(),
                static_cast<std::size_t>(gathered.size()) * sizeof(std::uint16_t));
  }
  /// See group.
  void all_to_all(matrix<T> const& in, matrix<T>& out, int split_dim, int concat_dim) const override {
    detail::all_to_all_on(mesh_.comm(0), in, out, split_dim, concat_dim);
  }
  /// See group.
  void reduce_scatter(matrix<T> const& in, matrix<T>& out, int dim) const override {
    detail::reduce_scatter_on(mesh_.comm(0), in, out, dim, detail::op_kind::sum);
  }

 private:
  Mesh mesh_;
};

/// The group of a 1-D mesh; a layer keeps one after parallelize.
template <class T, class Mesh>
std::shared_ptr<group<T> const> make_group(Mesh const& mesh) {
  static_assert(Mesh::ndim == 1,
                "shardwise::parallelize: tensor parallelism runs over one mesh axis; pass "
                "mesh.axis<\"tp\">() (or sw::submesh<\"tp\">(mesh))");
  return std::make_shared<group_of<Mesh, T> const>(mesh);
}

}  // namespace shardwise::nn
