// An xt::xarray whose layout is chosen at run time (layout_type::dynamic): shardwise needs it fixed.
#include <shardwise/adapters/xtensor.hpp>
#include <shardwise/mesh/collectives.hpp>
#include <shardwise/mesh/thread/comm.hpp>
namespace sw = shardwise;
#ifdef SHARDWISE_SHOULD_FAIL
using Array = xt::xarray<float, xt::layout_type::dynamic>;
#else
using Array = xt::xarray<float, xt::layout_type::row_major>;
#endif
void use(sw::Mesh<sw::ThreadComm, sw::axis<"tp">> const& mesh, Array& a) { sw::all_reduce(mesh, a); }
