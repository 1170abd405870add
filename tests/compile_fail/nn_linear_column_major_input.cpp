#include <shardwise/nn/layers/linear.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using input = Eigen::MatrixXf;  // column-major
#else
using input = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
#endif
sw::Activation<float> use(sw::Linear<float>& layer, input const& x) { return layer(x); }
