// is_model_supported given a tuple of model lists instead of a shardwise::models::model_list<...>.
#include <shardwise/models/registry.hpp>
#include <string_view>
#include <tuple>
namespace models = shardwise::models;
#ifdef SHARDWISE_SHOULD_FAIL
using MyModels = std::tuple<models::builtin_models>;
#else
using MyModels = models::builtin_models;
#endif
bool tensor_parallel(std::string_view name) { return models::is_model_supported<MyModels>(name).tensor_parallel; }
