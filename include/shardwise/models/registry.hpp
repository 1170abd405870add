#pragma once
// The compile-time counterpart of optimum-neuron's ParallelizersManager: which model types shardwise can
// parallelize, under which name, with which kinds of parallelism, and their parallelizer (the plan). A user's
// model joins by specializing shardwise::models::parallelizer for its template; lists of models
// (builtin_models, extended with builtin_models::with<UserModel>) answer by name at run time.
#include <array>
#include <cstddef>
#include <string_view>

#include "shardwise/models/gpt2_plan.hpp"
#include "shardwise/models/llama_plan.hpp"
#include "shardwise/models/llama_stage.hpp"

namespace shardwise::models {

/// What is_model_supported answers, like optimum-neuron's (tensor, sequence, pipeline) triple.
struct support {
  bool tensor_parallel = false;    ///< Tensor parallelism (a plan that cuts the layers over tp).
  bool sequence_parallel = false;  ///< Sequence parallelism (the residual stream cut along the tokens).
  bool pipeline_parallel = false;  ///< Pipeline parallelism.
  /// Equal when all three agree.
  constexpr bool operator==(support const&) const = default;
};

/// Specialize for a model template Model<T, Plan> (after them it may take std::size_t parameters, as Llama's
/// static head counts): name, supported, and plan<options...>.
template <template <class, class, std::size_t...> class Model>
struct parallelizer;

/// models::Llama, as "llama", with llama_plan.
template <>
struct parallelizer<Llama> {
  static constexpr std::string_view name = "llama";      ///< transformers' model_type.
  static constexpr support supported{true, true, true};  ///< Tensor, sequence and pipeline parallel.
  /// The plan, with llama_plan's options.
  template <bool SequenceParallel = true, bool ParallelizeEmbeddings = true, class LeaveAlone = leave_none>
  using plan = llama_plan<SequenceParallel, ParallelizeEmbeddings, LeaveAlone>;
  /// One pipeline stage of the model (LlamaStage), for sw::run_pipeline_step over a "pp" axis.
  template <class T, class Plan = serial_plan>
  using stage = LlamaStage<T, Plan>;
};

/// models::GPT2, as "gpt2", with gpt2_plan.
template <>
struct parallelizer<GPT2> {
  static constexpr std::string_view name = "gpt2";        ///< transformers' model_type.
  static constexpr support supported{true, true, false};  ///< Tensor and sequence parallel.
  /// The plan, with gpt2_plan's options.
  template <bool SequenceParallel = true>
  using plan = gpt2_plan<SequenceParallel>;
};

/// A model template with a parallelizer specialization giving its name and what it supports.
template <template <class, class, std::size_t...> class Model>
concept registered_model = requires {
  { parallelizer<Model>::name } -> std::convertible_to<std::string_view>;
  { parallelizer<Model>::supported } -> std::convertible_to<support>;
};

/// (tensor parallel, sequence parallel, pipeline parallel) for a model type; all false if it is not registered.
template <template <class, class, std::size_t...> class Model>
constexpr support is_model_supported() {
  if constexpr (registered_model<Model>)
    return parallelizer<Model>::supported;
  else
    return {};
}

/// A list of registered model templates, the set a name is looked up in. builtin_models holds shardwise's
/// own; a user's list extends it: `using my_models = shardwise::models::builtin_models::with<MyModel>;`.
template <template <class, class, std::size_t...> class... Models>
  requires(registered_model<Models> && ...)
struct model_list {
  static constexpr std::size_t size = sizeof...(Models);  ///< How many models.
  /// Each model's name, in the list's order.
  static constexpr std::array<std::string_view, size> names{std::string_view(parallelizer<Models>::name)...};
  /// What each model supports, in the list's order.
  static constexpr std::array<support, size> supported{support(parallelizer<Models>::supported)...};
  /// Whether no two models share a name (a lookup by name needs this).
  static constexpr bool unique_names = [] {
    for (std::size_t i = 0; i < size; ++i)
      for (std::size_t j = i + 1; j < size; ++j)
        if (names[i] == names[j]) return false;
    return true;
  }();
  /// This list with More appended.
  template <template <class, class, std::size_t...> class... More>
  using with = model_list<Models..., More...>;
};

/// The models shardwise itself can parallelize.
using builtin_models = model_list<Llama, GPT2>;

namespace detail {
template <class List>
inline constexpr bool is_model_list = false;
template <template <class, class, std::size_t...> class... Models>
inline constexpr bool is_model_list<model_list<Models...>> = true;
}  // namespace detail

/// The names of the models in a list (by default the built-in ones), in the list's order.
template <class List = builtin_models>
constexpr auto model_names() {
  static_assert(detail::is_model_list<List>,
                "shardwise::models::model_names: expects a shardwise::models::model_list<...>, such as "
                "builtin_models or builtin_models::with<YourModel>");
  if constexpr (detail::is_model_list<List>)
    return List::names;
  else
    return std::array<std::string_view, 0>{};  // never used: the static_assert above has failed
}

/// (tensor parallel, sequence parallel, pipeline parallel) for a model type given by name, as optimum-neuron's
/// ParallelizersManager.is_model_supported(model_type) answers; all false for a name the list does not hold.
/// Usable at run time (a name read from a config file) and at compile time.
template <class List = builtin_models>
constexpr support is_model_supported(std::string_view name) {
  static_assert(detail::is_model_list<List>,
                "shardwise::models::is_model_supported: expects a shardwise::models::model_list<...>, such as "
                "builtin_models or builtin_models::with<YourModel>");
  static_assert(List::unique_names,
                "shardwise::models::is_model_supported: two models in the list share a name; give each "
                "parallelizer<Model>::name its own");
  for (std::size_t i = 0; i < List::size; ++i)
    if (List::names[i] == name) return List::supported[i];
  return {};
}

/// The model built with its registered plan (options forwarded), ready for sw::parallelize.
template <template <class, class, std::size_t...> class Model, class T, bool... Options>
using parallelized = Model<T, typename parallelizer<Model>::template plan<Options...>>;

}  // namespace shardwise::models
