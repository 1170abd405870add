#pragma once
// Writes .npy files (NumPy's format: magic, a header dict, raw little-endian data) so a Python reference can
// read what the C++ side computed. Written to a temporary name and renamed, so a reader never sees half a file.
// Reads back C-ordered float64 and float32 arrays that a Python reference saved.
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

/// An array read back: its shape and its elements in row-major order, as double.
struct array {
  std::vector<long> shape;
  std::vector<double> data;
};

/// Reads a C-ordered little-endian float64 or float32 .npy file (what numpy.save writes for such arrays).
inline array read(std::filesystem::path const& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[10];
  if (!in.read(magic, 10) || std::string(magic, 6) != "\x93NUMPY")
    throw std::runtime_error("npy: " + path.string() + " is not a .npy file");
  std::size_t length = static_cast<unsigned char>(magic[8]) | static_cast<unsigned char>(magic[9]) << 8;
  if (magic[6] != 1) {  // versions 2 and 3: a 4-byte header length
    char more[2];
    in.read(more, 2);
    length |= std::size_t(static_cast<unsigned char>(more[0])) << 16 | std::size_t(static_cast<unsigned char>(more[1]))
                                                                           << 24;
  }
  std::string header(length, ' ');
  in.read(header.data(), static_cast<std::streamsize>(length));
  bool const f8 = header.find("'<f8'") != std::string::npos, f4 = header.find("'<f4'") != std::string::npos;
  if ((!f8 && !f4) || header.find("'fortran_order': False") == std::string::npos)
    throw std::runtime_error("npy: " + path.string() + " is not C-ordered float64 or float32: " + header);
  array a;
  std::size_t at = header.find('(', header.find("'shape'")), count = 1;
  for (std::size_t end = header.find(')', at); ++at < end;) {
    std::size_t used = 0;
    long const d = std::stol(header.substr(at), &used);
    a.shape.push_back(d);
    count *= static_cast<std::size_t>(d);
    at = header.find_first_of(",)", at + used);
    if (at >= end) break;
  }
  a.data.resize(count);
  if (f8) {
    in.read(reinterpret_cast<char*>(a.data.data()), static_cast<std::streamsize>(count * sizeof(double)));
  } else {
    std::vector<float> f(count);
    in.read(reinterpret_cast<char*>(f.data()), static_cast<std::streamsize>(count * sizeof(float)));
    for (std::size_t i = 0; i < count; ++i) a.data[i] = f[i];
  }
  if (!in) throw std::runtime_error("npy: " + path.string() + " is cut short");
  return a;
}

}  // namespace npy
