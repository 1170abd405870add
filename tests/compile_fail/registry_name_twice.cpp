// A list of models in which two share a name cannot answer is_model_supported(name): a compile error.
#include <shardwise/models/registry.hpp>
#include <string_view>
namespace sw = shardwise;
namespace models = shardwise::models;
namespace user {
template <class T, class Plan = sw::serial_plan>
struct Impostor {};
}  // namespace user
template <>
struct shardwise::models::parallelizer<user::Impostor> {
#ifdef SHARDWISE_SHOULD_FAIL
  static constexpr std::string_view name = "llama";  // the name of the built-in Llama
#else
  static constexpr std::string_view name = "impostor";
#endif
  static constexpr support supported{false, false, true};
  template <bool = true>
  using plan = sw::serial_plan;
};
using user_models = models::builtin_models::with<user::Impostor>;
bool pipeline_for(std::string_view name) { return models::is_model_supported<user_models>(name).pipeline_parallel; }
