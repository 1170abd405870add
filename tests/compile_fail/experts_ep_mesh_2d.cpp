// Experts are placed over one mesh axis: a mesh of two axes given as the ep mesh (the whole mesh rather than its
// "ep" axis) is a compile error that says to pass the axis.
#include <shardwise/models/llama.hpp>
namespace sw = shardwise;
using Model = sw::models::MoeLlama<float>;
#ifdef SHARDWISE_SHOULD_FAIL
using EpMesh = sw::Mesh<sw::ThreadComm, sw::axis<"edp">, sw::axis<"ep">>;
#else
using EpMesh = sw::Mesh<sw::ThreadComm, sw::axis<"ep">>;
#endif
void use(Model& model, EpMesh const& ep) { (void)sw::expert_parallelize(model, ep); }
