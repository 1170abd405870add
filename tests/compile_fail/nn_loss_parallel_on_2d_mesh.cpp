#include <shardwise/nn/training/loss.hpp>
namespace sw = shardwise;
float use(sw::Mesh<sw::ThreadComm, sw::axis<"dp">, sw::axis<"tp">> const& mesh,
          sw::Activation<float, sw::Shard<-1>> const& logits, std::vector<std::int64_t> const& targets) {
#ifdef SHARDWISE_SHOULD_FAIL
  return sw::loss_parallel(mesh, logits, targets).loss;
#else
  return sw::loss_parallel(mesh.axis<"tp">(), logits, targets).loss;
#endif
}
