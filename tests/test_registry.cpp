// The model registry: Llama and GPT-2 are there, a user's model joins by specialization, an unknown one is not
// supported; lists of models give their names and answer is_model_supported by name, at compile time and at run time.
#include <doctest/doctest.h>

#include <array>
#include <shardwise/models/registry.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace sw = shardwise;
namespace models = shardwise::models;

namespace user {
template <class T, class Plan = sw::serial_plan>
struct TinyMlp {
  sw::Linear<T, sw::layer_at<Plan, "up">> up;
  sw::Linear<T, sw::layer_at<Plan, "down">> down;
  SHARDWISE_CHILDREN(up, down)
  TinyMlp() : up(8, 16, 1), down(16, 8, 2) {}
};
template <class T, class Plan = sw::serial_plan>
struct Unregistered {};
template <class T, class Plan = sw::serial_plan>
struct Impostor {};
}  // namespace user

template <>
struct shardwise::models::parallelizer<user::TinyMlp> {
  static constexpr std::string_view name = "tiny-mlp";
  static constexpr support supported{true, false, false};
  template <bool = true>
  using plan = sw::plan<sw::at<"up", sw::ColwiseParallel<>>, sw::at<"down", sw::RowwiseParallel<>>>;
};

template <>
struct shardwise::models::parallelizer<user::Impostor> {
  static constexpr std::string_view name = "llama";  // the name of a built-in model
  static constexpr support supported{false, false, true};
};

static_assert(models::registered_model<models::Llama>);
static_assert(models::parallelizer<models::Llama>::name == "llama");
static_assert(models::is_model_supported<models::Llama>() == models::support{true, true, true});
// The pipeline support is a stage type that runs (test_llama_pipeline trains it against the unsharded model).
static_assert(std::is_same_v<models::parallelizer<models::Llama>::stage<float>, models::LlamaStage<float>>);
static_assert(models::is_model_supported<user::TinyMlp>() == models::support{true, false, false});
static_assert(!models::registered_model<user::Unregistered>);
static_assert(models::is_model_supported<user::Unregistered>() == models::support{});
static_assert(
    std::is_same_v<models::parallelized<models::Llama, float, false>, models::Llama<float, models::llama_plan<false>>>);
static_assert(models::is_model_supported<models::GPT2>() == models::support{true, true, false});
static_assert(
    std::is_same_v<models::parallelized<models::GPT2, float, true>, models::GPT2<float, models::gpt2_plan<true>>>);

// Lists of models: the built-in ones, and a user's list that extends them.
using user_models = models::builtin_models::with<user::TinyMlp>;
static_assert(models::builtin_models::size == 2);
static_assert(models::model_names() == std::array<std::string_view, 2>{"llama", "gpt2"});
static_assert(models::model_names<user_models>() == std::array<std::string_view, 3>{"llama", "gpt2", "tiny-mlp"});
static_assert(models::is_model_supported("llama") == models::support{true, true, true});
static_assert(models::is_model_supported("gpt2") == models::support{true, true, false});
static_assert(models::is_model_supported("tiny-mlp") == models::support{});  // not built in
static_assert(models::is_model_supported<user_models>("tiny-mlp") == models::support{true, false, false});
static_assert(models::is_model_supported<user_models>("llama") == models::support{true, true, true});
static_assert(models::is_model_supported("Llama") == models::support{});  // names match exactly, as model_type
static_assert(models::is_model_supported("") == models::support{});
// Two models under one name cannot be looked up by name; a model without a parallelizer cannot be listed.
static_assert(user_models::unique_names);
static_assert(!models::builtin_models::with<user::Impostor>::unique_names);
template <template <class, class, std::size_t...> class Model>
concept listable = requires { typename models::model_list<Model>; };
static_assert(listable<user::TinyMlp>);
static_assert(!listable<user::Unregistered>);

TEST_CASE("is_model_supported answers a model type named at run time") {
  // Names as they arrive from a configuration file: not constants.
  std::vector<std::string> const names{"llama", "tiny-mlp", "mistral"};
  CHECK(models::is_model_supported(names[0]) == models::support{true, true, true});
  CHECK(models::is_model_supported(names[1]) == models::support{});
  CHECK(models::is_model_supported(names[2]) == models::support{});
  CHECK(models::is_model_supported<user_models>(names[1]) == models::support{true, false, false});
  CHECK(models::is_model_supported<user_models>(names[2]) == models::support{});
  std::vector<std::string> listed;
  for (auto name : models::model_names<user_models>()) listed.emplace_back(name);
  CHECK(listed == std::vector<std::string>{"llama", "gpt2", "tiny-mlp"});
}

TEST_CASE("a registered user model is parallelized with its registered plan") {
  sw::run_threads(2, [](auto& world) {
    auto tp = sw::make_mesh<"tp">(world, {2});
    models::parallelized<user::TinyMlp, double> mlp;
    sw::parallelize(mlp, tp);
    CHECK(mlp.up.weight.rows() == 8);    // 16 output features over 2 ranks
    CHECK(mlp.down.weight.cols() == 8);  // 16 input features over 2 ranks
  });
}
