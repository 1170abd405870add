// Writing int16 elements to safetensors: safetensors has no dtype shardwise maps int16_t to.
#include <cstdint>
#include <shardwise/adapters/eigen.hpp>
#include <shardwise/checkpoint/safetensors_write.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Matrix = Eigen::Matrix<std::int16_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
#else
using Matrix = Eigen::Matrix<std::int32_t, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
#endif
void save(sw::safetensors_writer& writer, Matrix const& m) { writer.add("w", m); }
