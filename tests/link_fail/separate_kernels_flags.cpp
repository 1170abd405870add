// A file that calls the separately compiled kernels (shardwise::separate_kernels). Its twin is built with the
// library's flags and links; link_fail.separate_kernels_flags builds it with -mavx (Eigen's alignment 32, so
// another allocator) and requires the link to fail naming the settings, instead of a program that frees memory
// with the wrong allocator.
#include <shardwise/nn/kernels/functional.hpp>

int main() {
  shardwise::nn::matrix<float> x = shardwise::nn::matrix<float>::Ones(2, 3), w = x, y(2, 2);
  shardwise::nn::linear_forward<float>(x, w, std::nullopt, y);
  return y(0, 0) == 3 ? 0 : 1;
}
