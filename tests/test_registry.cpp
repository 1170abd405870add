// The model registry: Llama is there, a user's model joins by specialization, an unknown one is not supported.
#include <doctest/doctest.h>

#include <shardwise/models/registry.hpp>

namespace sw = shardwise;
namespace models = shardwise::models;

namespace user {
template <class T, class Plan = sw::serial_plan>
struct TinyMlp {
  sw::Linear<T, sw::style_at<Plan, "up">> up;
  sw::Linear<T, sw::style_at<Plan, "down">> down;
  SHARDWISE_CHILDREN(up, down)
  TinyMlp() : up(8, 16, 1), down(16, 8, 2) {}
};
template <class T, class Plan = sw::serial_plan>
struct Unregistered {};
}  // namespace user

template <>
struct shardwise::models::parallelizer<user::TinyMlp> {
  static constexpr std::string_view name = "tiny-mlp";
  static constexpr support supported{true, false, false};
  template <bool = true>
  using plan = sw::plan<sw::at<"up", sw::ColwiseParallel<>>, sw::at<"down", sw::RowwiseParallel<>>>;
};

static_assert(models::registered_model<models::Llama>);
static_assert(models::parallelizer<models::Llama>::name == "llama");
static_assert(models::is_model_supported<models::Llama>() == models::support{true, true, false});
static_assert(models::is_model_supported<user::TinyMlp>() == models::support{true, false, false});
static_assert(!models::registered_model<user::Unregistered>);
static_assert(models::is_model_supported<user::Unregistered>() == models::support{});
static_assert(
    std::is_same_v<models::parallelized<models::Llama, float, false>, models::Llama<float, models::llama_plan<false>>>);

TEST_CASE("a registered user model is parallelized with its registered plan") {
  sw::run_threads(2, [](auto& world) {
    auto tp = sw::make_mesh<"tp">(world, {2});
    models::parallelized<user::TinyMlp, double> mlp;
    sw::parallelize(mlp, tp);
    CHECK(mlp.up.weight.rows() == 8);    // 16 output features over 2 ranks
    CHECK(mlp.down.weight.cols() == 8);  // 16 input features over 2 ranks
  });
}
