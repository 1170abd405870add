#pragma once
// The optional members a module may define for the library to call, as one declared list. C++20 cannot list a
// class's members, so a hook the library looked up by name alone would be skipped without a word if misspelt;
// instead a module names its hooks in SHARDWISE_HOOKS(...), and every walk of the model checks both ways at
// compile time: each listed hook is defined (a misspelt member is an error), each defined hook is listed (a hook
// forgotten in the list is an error), and the list names only hooks that exist (a misspelt entry is an error).
#include <type_traits>

#include "shardwise/core/show.hpp"

namespace shardwise {

/// The hooks a module may list in SHARDWISE_HOOKS; each is a member named shardwise_<hook>.
namespace hooks {
/// `template <std::size_t Ranks> static constexpr bool shardwise_static_check()`: sw::parallelize, static tp size.
struct static_check {};
/// `void shardwise_on_parallelize(int tp_size)`: sw::parallelize, before it cuts any layer.
struct on_parallelize {};
/// `std::map<std::string, std::string> shardwise_config() const`: what checkpoints keep beside the weights.
struct config {};
/// `bool shardwise_other_stage(std::string_view tensor) const`: whether a checkpoint's tensor is another rank's to
/// read (another pipeline stage's, or an expert placed on another ep rank).
struct other_stage {};
/// `template <class Mesh> void shardwise_after_pipeline_step(Mesh const& pp, sw::pipeline_shape const& shape)`, or
/// without `shape`: at the end of each pipeline step.
struct after_pipeline_step {};
/// `void shardwise_on_context_parallel(std::shared_ptr<sw::context_parallel const> const&)`:
/// sw::context_parallelize; the module treats sequences cut over a cp axis itself (attention across the ranks).
struct on_context_parallel {};
/// `void shardwise_on_expert_parallel(std::shared_ptr<sw::expert_parallel const> const&)`: sw::expert_parallelize;
/// the module places its experts over an ep axis (keeps its rank's share, and sends tokens to their ranks).
struct on_expert_parallel {};
/// `static constexpr bool shardwise_token_wise = true`: the module's own code treats every row (token) alone, so
/// sw::context_parallelize may cut its sequences (its children declare for themselves).
struct token_wise {};
/// `std::size_t shardwise_position_limit() const`: sw::generate; the positions the model can embed (learned
/// position embeddings), so that a longer cache is refused up front.
struct position_limit {};
/// `void shardwise_pipeline_microbatch(int microbatch)`: sw::run_pipeline_step, before each forward of a chunk
/// (recomputations too), with the microbatch it runs; for what a chunk's forward needs to know of its
/// microbatch beyond the activation (models::LlamaStage: its sequences' lengths).
struct pipeline_microbatch {};
/// `sw::nn::vector<double> shardwise_pipeline_carry(sw::nn::vector<double> const& received, sw::pipeline_pass pass,
/// int microbatch)`: sw::run_pipeline_step, after each forward of a chunk (with what the stage before sent beside
/// its activation; empty on the first stage) and before each backward (with what the stage after sent beside its
/// gradient; on the last stage, what this hook gave after the forward); returns what goes beside the output or the
/// input gradient. For sums a stage's math needs of every stage (models::LlamaStage of experts: the router loads
/// that transformers' load-balancing loss pools over all the blocks).
struct pipeline_carry {};
}  // namespace hooks

/// The hooks a module lists (SHARDWISE_HOOKS).
template <class... Hooks>
struct hook_list {
  /// Whether Hook is in the list.
  template <class Hook>
  static constexpr bool has = (std::is_same_v<Hook, Hooks> || ...);
};

}  // namespace shardwise

#define SHARDWISE_DETAIL_HOOK_1(a) ::shardwise::hooks::a
#define SHARDWISE_DETAIL_HOOK_2(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_1(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_3(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_2(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_4(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_3(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_5(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_4(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_6(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_5(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_7(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_6(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_8(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_7(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_9(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_8(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_10(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_9(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_11(a, ...) ::shardwise::hooks::a, SHARDWISE_DETAIL_HOOK_10(__VA_ARGS__)
#define SHARDWISE_DETAIL_HOOK_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, name, ...) name

/// Inside a module: SHARDWISE_HOOKS(static_check, on_parallelize) names the optional members it defines for the
/// library to call (shardwise_static_check, shardwise_on_parallelize; see shardwise::hooks). It takes up to 11,
/// as many as there are hooks.
#define SHARDWISE_HOOKS(...)                                                                              \
  using shardwise_hooks = ::shardwise::hook_list<SHARDWISE_DETAIL_HOOK_PICK(                              \
      __VA_ARGS__, SHARDWISE_DETAIL_HOOK_11, SHARDWISE_DETAIL_HOOK_10, SHARDWISE_DETAIL_HOOK_9,           \
      SHARDWISE_DETAIL_HOOK_8, SHARDWISE_DETAIL_HOOK_7, SHARDWISE_DETAIL_HOOK_6, SHARDWISE_DETAIL_HOOK_5, \
      SHARDWISE_DETAIL_HOOK_4, SHARDWISE_DETAIL_HOOK_3, SHARDWISE_DETAIL_HOOK_2,                          \
      SHARDWISE_DETAIL_HOOK_1, )(__VA_ARGS__)>;

namespace shardwise::detail {

// Whether a class has a member of a hook's name, of any kind or signature: the name is ambiguous in a class
// derived from it and from a class that has a member of that name.
template <class Hook>
struct hook_name;
#define SHARDWISE_DETAIL_HOOK_NAME(hook)                       \
  template <>                                                  \
  struct hook_name<hooks::hook> {                              \
    struct named {                                             \
      int shardwise_##hook;                                    \
    };                                                         \
    template <class M>                                         \
    struct probe : M, named {};                                \
    template <class M>                                         \
    static constexpr bool in() {                               \
      if constexpr (std::is_final_v<M> || !std::is_class_v<M>) \
        return false;                                          \
      else                                                     \
        return !requires { &probe<M>::shardwise_##hook; };     \
    }                                                          \
  };
SHARDWISE_DETAIL_HOOK_NAME(static_check)
SHARDWISE_DETAIL_HOOK_NAME(on_parallelize)
SHARDWISE_DETAIL_HOOK_NAME(position_limit)
SHARDWISE_DETAIL_HOOK_NAME(config)
SHARDWISE_DETAIL_HOOK_NAME(other_stage)
SHARDWISE_DETAIL_HOOK_NAME(after_pipeline_step)
SHARDWISE_DETAIL_HOOK_NAME(on_context_parallel)
SHARDWISE_DETAIL_HOOK_NAME(on_expert_parallel)
SHARDWISE_DETAIL_HOOK_NAME(token_wise)
SHARDWISE_DETAIL_HOOK_NAME(pipeline_microbatch)
SHARDWISE_DETAIL_HOOK_NAME(pipeline_carry)
#undef SHARDWISE_DETAIL_HOOK_NAME

template <class M>
struct listed_hooks {
  using type = hook_list<>;
};
template <class M>
  requires requires { typename M::shardwise_hooks; }
struct listed_hooks<M> {
  using type = typename M::shardwise_hooks;
};

template <class M, class Hook>
struct hook_defined_but_not_listed;  // incomplete on purpose: the diagnostic names the module and the hook
template <class M, class Hook>
struct hook_listed_but_not_defined;

/// One hook of module M: defined if and only if listed.
template <class M, class Hook>
constexpr bool hook_declared() {
  constexpr bool defined = hook_name<Hook>::template in<M>(), listed = listed_hooks<M>::type::template has<Hook>;
  static_assert(!defined || listed,
                "shardwise::hooks: a module defines a hook (a member shardwise_<hook>, named below) that its "
                "SHARDWISE_HOOKS(...) does not list; add the hook to the list, or rename the member if it is not "
                "meant for shardwise");
  static_assert(
      defined || !listed,
      "shardwise::hooks: a module lists a hook in SHARDWISE_HOOKS(...) but defines no member shardwise_<hook> "
      "(named below); check the member's spelling");
  if constexpr (defined && !listed) {
    using shown [[maybe_unused]] = decltype(show_incomplete<hook_defined_but_not_listed<M, Hook>>());
  } else if constexpr (listed && !defined) {
    using shown [[maybe_unused]] = decltype(show_incomplete<hook_listed_but_not_defined<M, Hook>>());
  }
  return defined == listed;
}

/// Every hook of module M against its SHARDWISE_HOOKS list.
template <class M>
inline constexpr bool hooks_declared =
    hook_declared<M, hooks::static_check>() && hook_declared<M, hooks::on_parallelize>() &&
    hook_declared<M, hooks::config>() && hook_declared<M, hooks::other_stage>() &&
    hook_declared<M, hooks::after_pipeline_step>() && hook_declared<M, hooks::on_context_parallel>() &&
    hook_declared<M, hooks::token_wise>() && hook_declared<M, hooks::position_limit>() &&
    hook_declared<M, hooks::pipeline_microbatch>() && hook_declared<M, hooks::on_expert_parallel>() &&
    hook_declared<M, hooks::pipeline_carry>();

}  // namespace shardwise::detail
