#pragma once
// Moves values between the reference array and each tensor library through that library's own element
// access (m(i, j), t(index), t.element(...)), never through shardwise.
#include <Eigen/Core>
#include <array>
#include <type_traits>
#include <unsupported/Eigen/CXX11/Tensor>
#include <xtensor/xarray.hpp>
#include <xtensor/xtensor.hpp>

#include "support/reference.hpp"

namespace ref {

template <class S>
S to_scalar(double x) {
  if constexpr (std::is_arithmetic_v<S>)
    return static_cast<S>(x);
  else
    return S(static_cast<float>(x));
}
template <class S>
double to_double(S x) {
  if constexpr (std::is_arithmetic_v<S>)
    return static_cast<double>(x);
  else
    return static_cast<double>(static_cast<float>(x));
}

template <class T>
struct native;

template <class S, int R, int C, int O, int MR, int MC>
struct native<Eigen::Matrix<S, R, C, O, MR, MC>> {
  using type = Eigen::Matrix<S, R, C, O, MR, MC>;
  static constexpr bool vector = R == 1 || C == 1;
  static type make(Array const& a) {
    type m;
    if constexpr (vector) {
      m.resize(static_cast<Eigen::Index>(a.shape.at(0)));
      for (std::size_t i = 0; i < a.shape[0]; ++i) m(static_cast<Eigen::Index>(i)) = to_scalar<S>(a.at({i}));
    } else {
      m.resize(static_cast<Eigen::Index>(a.shape.at(0)), static_cast<Eigen::Index>(a.shape.at(1)));
      for (std::size_t i = 0; i < a.shape[0]; ++i)
        for (std::size_t j = 0; j < a.shape[1]; ++j)
          m(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)) = to_scalar<S>(a.at({i, j}));
    }
    return m;
  }
  static Array read(type const& m) {
    if constexpr (vector) {
      Array a = Array::zeros({static_cast<std::size_t>(m.size())});
      for (std::size_t i = 0; i < a.shape[0]; ++i) a.at({i}) = to_double(m(static_cast<Eigen::Index>(i)));
      return a;
    } else {
      Array a = Array::zeros({static_cast<std::size_t>(m.rows()), static_cast<std::size_t>(m.cols())});
      for (std::size_t i = 0; i < a.shape[0]; ++i)
        for (std::size_t j = 0; j < a.shape[1]; ++j)
          a.at({i, j}) = to_double(m(static_cast<Eigen::Index>(i), static_cast<Eigen::Index>(j)));
      return a;
    }
  }
};

template <class S, int N, int O, class I>
struct native<Eigen::Tensor<S, N, O, I>> {
  using type = Eigen::Tensor<S, N, O, I>;
  static std::array<I, N> index_of(std::vector<std::size_t> const& v) {
    std::array<I, N> idx{};
    for (int i = 0; i < N; ++i) idx[static_cast<std::size_t>(i)] = static_cast<I>(v[static_cast<std::size_t>(i)]);
    return idx;
  }
  static type make(Array const& a) {
    type t(index_of(a.shape));
    for (std::size_t f = 0; f < a.size(); ++f) t(index_of(a.unflat(f))) = to_scalar<S>(a.values[f]);
    return t;
  }
  static Array read(type const& t) {
    std::vector<std::size_t> shape;
    for (int i = 0; i < N; ++i) shape.push_back(static_cast<std::size_t>(t.dimension(i)));
    Array a = Array::zeros(shape);
    for (std::size_t f = 0; f < a.size(); ++f) a.values[f] = to_double(t(index_of(a.unflat(f))));
    return a;
  }
};

template <class X>
struct native_xtensor {
  static X make(Array const& a) {
    typename X::shape_type shape;
    if constexpr (requires { shape.resize(1); }) shape.resize(a.shape.size());
    for (std::size_t i = 0; i < a.shape.size(); ++i) shape[i] = a.shape[i];
    X t(shape);
    for (std::size_t f = 0; f < a.size(); ++f) {
      auto index = a.unflat(f);
      t.element(index.begin(), index.end()) = to_scalar<typename X::value_type>(a.values[f]);
    }
    return t;
  }
  static Array read(X const& t) {
    Array a = Array::zeros(std::vector<std::size_t>(t.shape().begin(), t.shape().end()));
    for (std::size_t f = 0; f < a.size(); ++f) {
      auto index = a.unflat(f);
      a.values[f] = to_double(t.element(index.begin(), index.end()));
    }
    return a;
  }
};
template <class EC, std::size_t N, xt::layout_type L, class Tag>
struct native<xt::xtensor_container<EC, N, L, Tag>> : native_xtensor<xt::xtensor_container<EC, N, L, Tag>> {};
template <class EC, xt::layout_type L, class SC, class Tag>
struct native<xt::xarray_container<EC, L, SC, Tag>> : native_xtensor<xt::xarray_container<EC, L, SC, Tag>> {};

template <class T>
T make(Array const& a) {
  return native<T>::make(a);
}
template <class T>
Array read(T const& t) {
  return native<T>::read(t);
}

}  // namespace ref
