#include <shardwise/nn.hpp>
namespace sw = shardwise;
struct Model {
  sw::Embedding<float> tok_embeddings{16, 8, 1};
  sw::Linear<float> output{8, 16, 2, false};
  SHARDWISE_CHILDREN(tok_embeddings, output)
  Model() {
#ifdef SHARDWISE_SHOULD_FAIL
    sw::tie_weights(tok_embeddings, output);  // the Linear reuses the Embedding's table, not the other way
#else
    sw::tie_weights(output, tok_embeddings);
#endif
  }
};
Model make() { return {}; }
