#include <shardwise/nn.hpp>
namespace sw = shardwise;
template <class T, class Plan>
struct Model {
  sw::Embedding<T, sw::layer_at<Plan, "tok_embeddings">> tok_embeddings;
  sw::Linear<T, sw::layer_at<Plan, "output">> output;
  SHARDWISE_CHILDREN(tok_embeddings, output)
  Model() : tok_embeddings(16, 8, 1), output(8, 16, 2, false) { sw::tie_weights(output, tok_embeddings); }
};
#ifdef SHARDWISE_SHOULD_FAIL
// The embedding cuts the vocabulary rows (Shard<0>), the output its input columns (Shard<1>): not one tensor.
using plan = sw::plan<sw::at<"tok_embeddings", sw::RowwiseParallel<sw::Replicate, sw::Replicate>>,
                      sw::at<"output", sw::RowwiseParallel<>>>;
#else
using plan = sw::plan<sw::at<"tok_embeddings", sw::RowwiseParallel<sw::Replicate, sw::Replicate>>,
                      sw::at<"output", sw::ColwiseParallel<>>>;
#endif
Model<float, plan> make() { return {}; }
