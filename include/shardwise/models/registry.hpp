#pragma once
// The compile-time counterpart of optimum-neuron's ParallelizersManager: which model types shardwise can
// parallelize, under which name, with which kinds of parallelism, and their parallelizer (the plan). A user's
// model joins by specializing shardwise::models::parallelizer for its template.
#include <string_view>

#include "shardwise/models/llama_plan.hpp"

namespace shardwise::models {

/// What is_model_supported answers, like optimum-neuron's (tensor, sequence, pipeline) triple.
struct support {
  bool tensor_parallel = false;
  bool sequence_parallel = false;
  bool pipeline_parallel = false;
  constexpr bool operator==(support const&) const = default;
};

/// Specialize for a model template Model<T, Plan>: name, supported, and plan<options...>.
template <template <class, class> class Model>
struct parallelizer;

template <>
struct parallelizer<Llama> {
  static constexpr std::string_view name = "llama";
  static constexpr support supported{true, true, false};
  template <bool SequenceParallel = true, bool ParallelizeEmbeddings = true, class LeaveAlone = leave_none>
  using plan = llama_plan<SequenceParallel, ParallelizeEmbeddings, LeaveAlone>;
};

template <template <class, class> class Model>
concept registered_model = requires {
  { parallelizer<Model>::name } -> std::convertible_to<std::string_view>;
  { parallelizer<Model>::supported } -> std::convertible_to<support>;
};

/// (tensor parallel, sequence parallel, pipeline parallel) for a model type; all false if it is not registered.
template <template <class, class> class Model>
constexpr support is_model_supported() {
  if constexpr (registered_model<Model>)
    return parallelizer<Model>::supported;
  else
    return {};
}

/// The model built with its registered plan (options forwarded), ready for sw::parallelize.
template <template <class, class> class Model, class T, bool... Options>
using parallelized = Model<T, typename parallelizer<Model>::template plan<Options...>>;

}  // namespace shardwise::models
