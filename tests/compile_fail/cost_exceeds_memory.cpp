#include <shardwise/models/llama.hpp>
#include <shardwise/models/llama_plan.hpp>
namespace sw = shardwise;
namespace models = shardwise::models;
constexpr models::LlamaConfig config{
    .vocabulary = 256, .dim = 64, .layers = 1, .heads = 8, .kv_heads = 4, .hidden = 176};
using Block = models::LlamaBlock<float, sw::subplan<models::llama_plan<>, "layers.*">>;
// At tp 2 the block holds (128 + 64 x 96 + 3 x 64 x 88) x 4 bytes of parameters per rank, as many of gradients,
// and the sequence-parallel norms' pending sums (128 x 4): 185,856 bytes.
constexpr std::size_t held = sw::cost_of<Block>(config, sw::cost_inputs{128, 2, 0}).bytes_per_rank();
#ifdef SHARDWISE_SHOULD_FAIL
static_assert(sw::fits_in_memory<held, 150000>());
#else
static_assert(sw::fits_in_memory<held, 185856>());
#endif
