// Reading a safetensors tensor into int16 elements: safetensors has no dtype shardwise maps int16_t to.
#include <cstdint>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/checkpoint/safetensors_read.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Matrix = Eigen::Matrix<std::int16_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
#else
using Matrix = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
#endif
void load(sw::safetensors_file const& file, Matrix& m) { file.load_into("w", m); }
