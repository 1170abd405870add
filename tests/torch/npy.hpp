#pragma once
// Writes .npy files (NumPy's format: magic, a header dict, raw little-endian data) so a Python reference can
// read what the C++ side computed. Written to a temporary name and renamed, so a reader never sees half a file.
#include <Eigen/Core>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace npy {

inline void write(std::filesystem::path const& path, double const* data, std::vector<long> const& shape) {
  std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (";
  long count = 1;
  for (long s : shape) {
    header += std::to_string(s) + ",";
    count *= s;
  }
  header += "), }";
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  auto const temporary = path.string() + ".partial";
  {
    std::ofstream out(temporary, std::ios::binary);
    out.write("\x93NUMPY\x01\x00", 8);
    unsigned short const length = static_cast<unsigned short>(header.size());
    out.put(static_cast<char>(length & 0xff));
    out.put(static_cast<char>(length >> 8));
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    out.write(reinterpret_cast<char const*>(data), static_cast<std::streamsize>(count * sizeof(double)));
    if (!out) throw std::runtime_error("npy: cannot write " + temporary);
  }
  std::filesystem::rename(temporary, path);
}

/// A row-major matrix (or a vector, as shape [n]).
template <class Dense>
void write(std::filesystem::path const& path, Dense const& m) {
  Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor> const row_major = m.template cast<double>();
  if (Dense::ColsAtCompileTime == 1)
    write(path, row_major.data(), {long(row_major.rows())});
  else
    write(path, row_major.data(), {long(row_major.rows()), long(row_major.cols())});
}

}  // namespace npy
