#include <shardwise/nn/layers/norm.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using input = sw::nn::matrix<double>;  // the layer's element type is float
#else
using input = sw::nn::matrix<float>;
#endif
sw::Activation<float> use(sw::RMSNorm<float>& norm, input const& x) { return norm(x); }
