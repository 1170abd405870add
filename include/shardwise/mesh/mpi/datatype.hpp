#pragma once
// What MpiComm's calls hand MPI: the datatype of an element type, the reduction operation (MPI's own on built-in
// types, ours on 16-bit floats), and the checks of an MPI call's result and of a count that must fit an int.
#include <mpi.h>

#include <climits>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include "shardwise/core/error.hpp"
#include "shardwise/core/reduce.hpp"

namespace shardwise {

namespace detail {

template <class T>
MPI_Datatype mpi_datatype() {
  if constexpr (std::is_same_v<T, float>)
    return MPI_FLOAT;
  else if constexpr (std::is_same_v<T, double>)
    return MPI_DOUBLE;
  else if constexpr (std::is_same_v<T, std::int8_t>)
    return MPI_INT8_T;
  else if constexpr (std::is_same_v<T, std::uint8_t>)
    return MPI_UINT8_T;
  else if constexpr (std::is_same_v<T, std::int16_t>)
    return MPI_INT16_T;
  else if constexpr (std::is_same_v<T, std::uint16_t>)
    return MPI_UINT16_T;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return MPI_INT32_T;
  else if constexpr (std::is_same_v<T, std::uint32_t>)
    return MPI_UINT32_T;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return MPI_INT64_T;
  else if constexpr (std::is_same_v<T, std::uint64_t>)
    return MPI_UINT64_T;
  else if constexpr (sizeof(T) == 2)
    return MPI_UINT16_T;  // bfloat16, half: moved as bits, reduced by our own op
  else {
    static_assert(sizeof(T) == 0,
                  "shardwise::MpiComm: no MPI datatype for this element type; use float, double, "
                  "Eigen::bfloat16, Eigen::half or a fixed-width integer");
    return MPI_BYTE;
  }
}

template <class T>
inline constexpr bool mpi_reduces_natively = std::is_arithmetic_v<T>;

template <class T, op_kind Op>
void mpi_user_reduce(void* in, void* inout, int* count, MPI_Datatype*) {
  auto const* a = static_cast<T const*>(in);
  auto* b = static_cast<T*>(inout);
  for (int i = 0; i < *count; ++i) b[i] = combine<Op>(a[i], b[i]);
}

/// The MPI operation for a reduction: native for built-in types (an average is a sum, divided afterwards).
template <class T, op_kind Op>
MPI_Op mpi_op() {
  if constexpr (mpi_reduces_natively<T>) {
    if constexpr (Op == op_kind::max)
      return MPI_MAX;
    else if constexpr (Op == op_kind::min)
      return MPI_MIN;
    else
      return MPI_SUM;
  } else {
    static MPI_Op const op = [] {
      MPI_Op created;
      MPI_Op_create(&mpi_user_reduce<T, Op>, /*commute=*/1, &created);
      return created;
    }();
    return op;
  }
}

inline void mpi_check(int code, char const* what) {
  if (code != MPI_SUCCESS) {
    char text[MPI_MAX_ERROR_STRING];
    int length = 0;
    MPI_Error_string(code, text, &length);
    fail("shardwise::MpiComm: ", what, " failed: ", std::string_view(text, static_cast<std::size_t>(length)));
  }
}

inline int mpi_count(std::size_t n, char const* what) {
  if (n > static_cast<std::size_t>(INT_MAX))
    fail("shardwise::", what, ": ", n, " elements exceed MPI's count limit of ", INT_MAX, "; split the tensor");
  return static_cast<int>(n);
}

}  // namespace detail

}  // namespace shardwise
