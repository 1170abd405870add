// model_names given a tuple instead of a shardwise::models::model_list<...>.
#include <cstddef>
#include <shardwise/models/registry.hpp>
#include <tuple>
namespace models = shardwise::models;
#ifdef SHARDWISE_SHOULD_FAIL
using MyModels = std::tuple<models::builtin_models>;
#else
using MyModels = models::builtin_models;
#endif
std::size_t count() { return models::model_names<MyModels>().size(); }
