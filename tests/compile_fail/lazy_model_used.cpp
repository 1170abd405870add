// A model declared with sw::Lazy has no forward until it is materialized: calling it is a compile error.
#include <cstdint>
#include <shardwise/models/llama.hpp>
#include <shardwise/shardwise.hpp>
#include <vector>
namespace sw = shardwise;
using Model = shardwise::models::Llama<float>;
void use(sw::Lazy<Model>& lazy, std::vector<std::int64_t> const& ids) {
#ifdef SHARDWISE_SHOULD_FAIL
  (void)lazy.forward(ids);
#else
  (void)sw::materialize(lazy).forward(ids);
#endif
}
