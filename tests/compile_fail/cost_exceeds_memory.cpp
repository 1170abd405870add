#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_plan.hpp>
namespace sw = shardwise;
namespace models = shardwise::models;
constexpr models::LlamaConfig config{
    .vocabulary = 256, .dim = 64, .layers = 1, .heads = 8, .kv_heads = 4, .hidden = 176};
using Block = models::LlamaBlock<float, sw::subplan<models::llama_plan<>, "layers.*">>;
// At tp 2, 128 tokens in 4 sequences, the block holds per rank (128 + 64 x 96 + 3 x 64 x 88) x 4 bytes of
// parameters, as many of gradients and the sequence-parallel norms' pending sums (128 x 4): 185,856 bytes; and
// what its forward keeps for its backward: the norms' inputs and statistics (2 x 64 x 65 x 4), the seven
// projections' inputs (128 x (3 x 64 + 32 + 2 x 64 + 88) x 4), q, k, v (128 x 64 x 4), each query row's
// softmax logsumexp per head (128 x 4 x 4) and the feed-forward's hidden tensors (3 x 128 x 88 x 4): 428,544 bytes.
constexpr std::size_t held = sw::cost_of<Block>(config, sw::cost_inputs{128, 2, 0}).bytes_per_rank();
#ifdef SHARDWISE_SHOULD_FAIL
static_assert(sw::fits_in_memory<held, 600000>());
#else
static_assert(sw::fits_in_memory<held, 614400>());
#endif
