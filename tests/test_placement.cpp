// Placements and layouts, and the collectives redistribute picks: decided at compile time (static_assert).
#include <doctest/doctest.h>

#include <shardwise/adapters/eigen.hpp>
#include <shardwise/shardwise.hpp>

namespace sw = shardwise;
using sw::Layout, sw::Shard, sw::Replicate, sw::Partial;
using sw::detail::step_kind;

static_assert(sw::placement<Shard<0>> && sw::placement<Shard<-1>> && sw::placement<Replicate> &&
              sw::placement<Partial<>> && sw::placement<Partial<sw::Max>>);
static_assert(!sw::placement<int> && !sw::placement<Partial<int>>);
static_assert(sw::layout<Layout<Shard<0>, Replicate>> && !sw::layout<Layout<int>>);
static_assert(std::is_same_v<Partial<>::op, sw::Sum>);

using Tensor1D = sw::DTensor<Eigen::MatrixXf, sw::Mesh<sw::SerialComm, sw::axis<"tp">>, Layout<Shard<0>>>;
template <class From, class To>
constexpr auto plan_1d =
    sw::DTensor<Eigen::MatrixXf, sw::Mesh<sw::SerialComm, sw::axis<"tp">>, From>::template planned<To>();
template <class From, class To>
constexpr auto plan_2d = sw::DTensor<Eigen::MatrixXf, sw::Mesh<sw::SerialComm, sw::axis<"dp">, sw::axis<"tp">>,
                                     From>::template planned<To>();

template <auto Plan, step_kind... Kinds>
constexpr bool steps_are() {
  if (Plan.count != sizeof...(Kinds) || !Plan.valid) return false;
  step_kind const kinds[] = {Kinds..., step_kind::slice};
  for (std::size_t i = 0; i < Plan.count; ++i)
    if (Plan.steps[i].kind != kinds[i]) return false;
  return true;
}

// The table of design.md, one mesh axis.
static_assert(steps_are<plan_1d<Layout<Replicate>, Layout<Replicate>>>());
static_assert(steps_are<plan_1d<Layout<Replicate>, Layout<Shard<1>>>, step_kind::slice>());
static_assert(steps_are<plan_1d<Layout<Replicate>, Layout<Partial<>>>, step_kind::keep_one>());
static_assert(steps_are<plan_1d<Layout<Shard<0>>, Layout<Replicate>>, step_kind::all_gather>());
static_assert(steps_are<plan_1d<Layout<Shard<0>>, Layout<Shard<1>>>, step_kind::all_to_all>());
static_assert(steps_are<plan_1d<Layout<Shard<1>>, Layout<Shard<-1>>>>());  // the same dimension, spelled twice
static_assert(steps_are<plan_1d<Layout<Partial<>>, Layout<Replicate>>, step_kind::all_reduce>());
static_assert(steps_are<plan_1d<Layout<Partial<>>, Layout<Shard<0>>>, step_kind::reduce_scatter>());
static_assert(steps_are<plan_1d<Layout<Partial<>>, Layout<Partial<sw::Max>>>, step_kind::repartial>());
static_assert(!plan_1d<Layout<Shard<0>>, Layout<Partial<>>>.valid);

// Two axes: independent dimensions move axis by axis; one dimension cut twice is gathered inside-out first.
static_assert(steps_are<plan_2d<Layout<Shard<0>, Shard<1>>, Layout<Replicate, Shard<1>>>, step_kind::all_gather>());
static_assert(plan_2d<Layout<Shard<0>, Shard<1>>, Layout<Replicate, Shard<1>>>.steps[0].axis == 0);
static_assert(steps_are<plan_2d<Layout<Partial<>, Replicate>, Layout<Shard<0>, Shard<1>>>, step_kind::reduce_scatter,
                        step_kind::slice>());
static_assert(steps_are<plan_2d<Layout<Shard<0>, Shard<0>>, Layout<Replicate, Shard<0>>>, step_kind::all_gather,
                        step_kind::all_gather, step_kind::slice>());
static_assert(plan_2d<Layout<Shard<0>, Shard<0>>, Layout<Replicate, Shard<0>>>.steps[0].axis == 1);
static_assert(steps_are<plan_2d<Layout<Shard<0>, Shard<0>>, Layout<Shard<0>, Replicate>>, step_kind::all_gather>());
static_assert(steps_are<plan_2d<Layout<Shard<0>, Shard<1>>, Layout<Shard<1>, Shard<0>>>, step_kind::all_gather,
                        step_kind::all_gather, step_kind::slice, step_kind::slice>());

TEST_CASE("a plan is also available at run time, for tensors whose rank is known only then") {
  using sw::detail::placement_kind, sw::detail::placement_value;
  std::array<placement_value, 1> const from{placement_value{placement_kind::shard, 0}};
  std::array<placement_value, 1> const to{placement_value{placement_kind::shard, 2}};
  auto const plan = sw::detail::plan_redistribute(from, to);
  REQUIRE(plan.count == 1);
  CHECK(plan.steps[0].kind == step_kind::all_to_all);
}
