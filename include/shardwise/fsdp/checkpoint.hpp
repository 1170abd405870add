#pragma once
// Checkpoints of a model under FSDP, each rank reading and writing only its shards:
//
//   sw::save_sharded(sharded, "ckpt", step);          // FSDP alone: every dp rank writes its rows
//   sw::save_sharded(sharded, tp, "ckpt", step);      // FSDP x TP: every (dp, tp) rank writes its block
//   sw::save_sharded(sharded, [optimizer,] [tp,] "ckpt", step, saver);  // the same, in the background
//   sw::load_sharded(sharded, [tp,] "ckpt");          // any checkpoint of the model: another dp x tp, TP-only, ...
//   sw::load_consolidated(sharded, [tp,] "model.safetensors", sw::transformers_llama_name);
//
// A rank's shard of a parameter is a box of the global tensor (its tp block's rows [first_row, + rows)), so the
// checkpoint is the sharded one of checkpoint/sharded.hpp with one rank folder per (tp, dp) rank
// ("tp_rank_01_pp_rank_00_dp_rank_03"): its index lists the boxes, `shardwise consolidate` merges them into one
// model.safetensors, and a load reads only the boxes that meet this rank's shard. Under hybrid sharding the first
// replica saves (the others hold the same shards); under no_shard data-parallel rank 0 does.
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/async_save.hpp"
#include "shardwise/checkpoint/optimizer_state.hpp"
#include "shardwise/checkpoint/sharded.hpp"
#include "shardwise/core/error.hpp"
#include "shardwise/fsdp/fully_shard.hpp"
#include "shardwise/mesh/mesh.hpp"
#include "shardwise/nn/training/optim.hpp"
#include "shardwise/plan/hooks.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise {

namespace detail {

/// Refuses a tp mesh (or its absence) that is not the one the sharded model's parameters are cut over.
template <class Sharded, class... Tp>
void check_fsdp_tp(Sharded const& sharded, std::string_view who, Tp const&... tp) {
  int const given = (1 * ... * tp.size());
  if (given != sharded.tensor_parallel_size())
    fail("shardwise::", who, ": the model's parameters are cut over a tensor-parallel group of ",
         sharded.tensor_parallel_size(), " ranks but ",
         sizeof...(Tp) ? "the tp mesh given has " : "no tp mesh was given (", given,
         sizeof...(Tp) ? " ranks" : " rank)", "; pass the tp mesh the model was parallelized over");
}

/// A model under FSDP and its AdamW, walked as one checkpoint: the parameters' shards, then their moments as
/// tensors "optimizer.<parameter>.exp_avg" and "...exp_avg_sq", cut as the parameter is, so that they reshard
/// on load as the parameters do.
template <class Sharded, class T>
struct sharded_with_state {
  Sharded& sharded;
  AdamW<T>& optimizer;

  template <class Fn>
  void shardwise_for_each_parameter_shard(Fn&& fn) {
    sharded.shardwise_for_each_parameter_shard(fn);
    std::vector<std::pair<std::span<T>, std::span<T>>> moments;
    optimizer.for_each_state(sharded, [&](std::size_t, std::span<T> m, std::span<T> v) { moments.emplace_back(m, v); });
    std::size_t i = 0;
    sharded.shardwise_for_each_parameter_shard(
        [&](std::string const& name, auto const& p, auto rows, auto cols, auto first_row, auto const& shard) {
          if (is_frozen(p)) return;  // no state (sw::freeze): the optimizer never saw it
          auto const [m, v] = moments[i++];
          for (auto const& [moment, suffix] : {std::pair{m, ".exp_avg"}, std::pair{v, ".exp_avg_sq"}}) {
            nn::matrix<T> values = Eigen::Map<nn::matrix<T> const>(moment.data(), shard.rows(), shard.cols());
            fn(concat(optimizer_state_prefix, name, suffix), p, rows, cols, first_row, values);
            std::copy(values.data(), values.data() + values.size(), moment.data());
          }
        });
  }
  [[nodiscard]] auto shardwise_config() const
    requires requires { sharded.shardwise_config(); }
  {
    return sharded.shardwise_config();
  }
  /// For loaders: a checkpoint saved without the optimizer is refused by name, not as a missing tensor.
  void shardwise_check_index(checkpoint_index const& index, std::string const& file) const {
    check_has_optimizer_state(index, file);
  }
  [[nodiscard]] auto const& data_mesh() const { return sharded.data_mesh(); }
  [[nodiscard]] auto const& replicate_mesh() const
    requires requires { sharded.replicate_mesh(); }
  {
    return sharded.replicate_mesh();
  }
  [[nodiscard]] int replica() const { return sharded.replica(); }
};

/// Whether M is a pipeline stage (a module with the pipeline's hooks) or a rank's chunks of stages.
template <class M>
inline constexpr bool pipeline_stage_model =
    hook_name<hooks::pipeline_microbatch>::in<M>() || hook_name<hooks::after_pipeline_step>::in<M>();
template <class Chunk>
inline constexpr bool pipeline_stage_model<stage_chunks<Chunk>> = true;

/// Refuses a save of a model under FSDP over the wrong tp mesh, or whose lazy shards no load has filled.
template <class Sharded, class... Tp>
void check_fsdp_save(Sharded& sharded, Tp const&... tp) {
  using Model = std::remove_cvref_t<decltype(sharded.model())>;
  static_assert(!pipeline_stage_model<Model>,
                "shardwise::save_sharded: the model under FSDP is a pipeline stage, and the saves of a model under "
                "FSDP do not take the pipeline axis (every stage would write the same rank files); checkpoints of "
                "FSDP within pipeline stages are not offered yet: save the stages without FSDP "
                "(save_sharded(stage, tp, pp, dir, step)), or the whole model under FSDP");
  check_fsdp_tp(sharded, "save_sharded", tp...);
  refuse_placed_experts(sharded.model(), "checkpoints under sw::fully_shard are");
  if (sharded.shardwise_unfilled())
    fail(
        "shardwise::save_sharded: the model was declared with sw::Lazy and no load has filled its shards, so "
        "they hold zeros; load it (load_sharded, load_consolidated) before saving it");
}

/// The ranks of a save of a model under FSDP: its dp and tp ranks, each writing its shards (under no_shard,
/// dp rank 0 writes the whole tensors). `owning`: the group keeps copies of the meshes (an asynchronous save
/// uses it after the call returns), else references.
template <bool owning = false, class Sharded, class... Tp>
save_group fsdp_save_group(Sharded& sharded, Tp const&... tp) {
  auto const& dp = sharded.data_mesh();
  auto group = owning ? owning_save_group(tp..., dp) : save_group_over(tp..., dp);
  if constexpr (sizeof...(Tp) == 1) group.tp_size = (tp.size(), ...), group.tp_rank = (tp.rank(), ...);
  group.dp_size = dp.size(), group.dp_rank = dp.rank();
  group.writes = Sharded::shards_parameters || dp.rank() == 0;  // no_shard: whole tensors everywhere; rank 0's
  return group;
}

/// Saves `walked` (the sharded model, or it with its optimizer state) over the model's dp and tp ranks.
template <class Sharded, class Walked, class... Tp>
void save_fsdp(Sharded& sharded, Walked& walked, std::filesystem::path const& dir, std::int64_t step,
               std::map<std::string, std::string> const& metadata, Tp const&... tp) {
  check_fsdp_save(sharded, tp...);
  auto const save = [&] {
    save_sharded_stage(tensors_of(walked), fsdp_save_group(sharded, tp...), dir, step, metadata, {});
  };
  if constexpr (requires { sharded.replicate_mesh(); }) {
    // Hybrid: every replica holds the same shards and the first saves them; the others return when it has
    // committed (so a rank that reads the checkpoint next finds it), or raise its error.
    std::string error;
    try {
      if (sharded.replica() == 0) save();
    } catch (std::exception const& e) {
      error = e.what();
    }
    agree_on_errors_across(error, "saving from the first replica", dir, "save_sharded", sharded.replicate_mesh());
  } else {
    save();
  }
}

/// save_fsdp through an async_save: the shards are copied now and written in the background. Under hybrid
/// sharding the first replica saves, and the outcome is agreed over the replicas when it is committed; a save
/// that cannot start is raised on every replica at once.
template <class Sharded, class Walked, class... Tp>
void save_fsdp_async(Sharded& sharded, Walked& walked, std::filesystem::path const& dir, std::int64_t step,
                     std::map<std::string, std::string> const& metadata, async_save& saver, Tp const&... tp) {
  check_fsdp_save(sharded, tp...);
  auto const start = [&] {
    async_save_access::start(saver, walked, fsdp_save_group<true>(sharded, tp...), dir, step, metadata, {});
  };
  if constexpr (requires { sharded.replicate_mesh(); }) {
    std::string error;
    try {
      if (sharded.replica() == 0)
        start();
      else
        async_save_access::finish(saver);  // the previous save's outcome, agreed over the replicas as theirs
    } catch (std::exception const& e) {
      error = e.what();
    }
    agree_on_errors_across(error, "starting the save from the first replica", dir, "save_sharded",
                           sharded.replicate_mesh());
    async_save_access::extend_over(saver, sharded.replicate_mesh(), dir, "saving from the first replica");
  } else {
    start();
  }
}

/// Loads `walked` (the sharded model, or it with its optimizer state), agreed over every rank of the model.
template <class Sharded, class Walked, class... Tp>
checkpoint_index load_fsdp(Sharded& sharded, Walked& walked, std::filesystem::path const& dir,
                           load_options const& options, Tp const&... tp) {
  refuse_placed_experts(sharded.model(), "checkpoints under sw::fully_shard are");
  auto const& dp = sharded.data_mesh();
  single_stage const one_tp;
  auto const& layout_tp = [&]() -> auto const& {
    if constexpr (sizeof...(Tp) == 1)
      return (tp, ...);
    else
      return one_tp;
  }();
  checkpoint_index index;
  if constexpr (requires { sharded.replicate_mesh(); })
    index = load_sharded_agreed(walked, layout_tp, dir, options, tp..., dp, sharded.replicate_mesh());
  else
    index = load_sharded_agreed(walked, layout_tp, dir, options, tp..., dp);
  sharded.shardwise_mark_loaded();
  return index;
}

/// load_consolidated into a model under FSDP; `tp` is its tp mesh or single_stage.
template <class Sharded, class Tp>
std::map<std::string, std::string> load_fsdp_file(Sharded& sharded, Tp const& tp, std::filesystem::path const& file,
                                                  std::function<std::string(std::string const&)> const& names,
                                                  load_options const& options) {
  refuse_placed_experts(sharded.model(), "checkpoints under sw::fully_shard are");
  auto metadata = load_mapped(sharded, tp, file, renaming(names), options, "load_consolidated").metadata;
  sharded.shardwise_mark_loaded();
  return metadata;
}

/// The options, checked for a model under FSDP.
template <class Sharded, class... Tp>
load_options fsdp_load_options(Sharded const& sharded, std::string_view who, load_options options, Tp const&... tp) {
  check_fsdp_tp(sharded, who, tp...);
  if (options.ranks_per_step > 0 && !options.turns)
    fail("shardwise::", who,
         ": load_options ranks_per_step takes turns within a tp group; under FSDP every rank reads only its own "
         "shard (its rows), so take turns over the node (load_options::turns = sw::node_turns(world)), or leave "
         "it unset (or set only_rank0_reads for one reader)");
  return options;
}

}  // namespace detail

/// Saves a model under FSDP (without tensor parallelism) as a sharded checkpoint in `dir`: every data-parallel
/// rank writes its rows of every parameter, collectively; `dir` is replaced atomically. The checkpoint loads
/// into any data-parallel or tensor-parallel size (load_sharded) and consolidates (`shardwise consolidate`).
template <module Model, class Policy, class ShardMesh, class ReplicateMesh>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, std::filesystem::path const& dir,
                  std::int64_t step, std::map<std::string, std::string> const& metadata = {}) {
  detail::save_fsdp(sharded, sharded, dir, step, metadata);
}

/// Saves a model under FSDP x TP: every (dp, tp) rank writes its block, collectively over both. `tp` is the
/// mesh the model was parallelized over (sw::submesh<"tp">(mesh)).
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, device_mesh TpMesh>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, TpMesh const& tp,
                  std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  detail::save_fsdp(sharded, sharded, dir, step, metadata, tp);
}

/// Saves the model and its AdamW state in one atomic commit: each rank's moments are cut as its parameter
/// shards are (tensors "optimizer.<parameter>.exp_avg" / ".exp_avg_sq" in its rank file), so training resumes
/// under any dp x tp (load_sharded with the optimizer). consolidate and loads of the model alone pass over them.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, class T>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, AdamW<T>& optimizer,
                  std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  detail::sharded_with_state<fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>, T> walked{sharded, optimizer};
  detail::save_fsdp(sharded, walked, dir, step, detail::with_steps(metadata, optimizer));
}

/// The model and its AdamW state under FSDP x TP; `tp` is the mesh the model was parallelized over.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, class T, device_mesh TpMesh>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, AdamW<T>& optimizer,
                  TpMesh const& tp, std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  detail::sharded_with_state<fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>, T> walked{sharded, optimizer};
  detail::save_fsdp(sharded, walked, dir, step, detail::with_steps(metadata, optimizer), tp);
}

/// save_sharded of a model under FSDP (without tensor parallelism), asynchronously through `saver`
/// (sw::async_save): collectively over the dp ranks it finishes the saver's previous save, copies each rank's
/// shards into memory and returns; they are written in the background and committed by the saver's next call
/// (wait(), poll(), the next save), which raises a failure on every rank.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, std::filesystem::path const& dir,
                  std::int64_t step, async_save& saver, std::map<std::string, std::string> const& metadata = {}) {
  detail::save_fsdp_async(sharded, sharded, dir, step, metadata, saver);
}

/// The same under FSDP x TP; `tp` is the mesh the model was parallelized over.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, device_mesh TpMesh>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, TpMesh const& tp,
                  std::filesystem::path const& dir, std::int64_t step, async_save& saver,
                  std::map<std::string, std::string> const& metadata = {}) {
  detail::save_fsdp_async(sharded, sharded, dir, step, metadata, saver, tp);
}

/// The model and its AdamW state under FSDP, asynchronously through `saver` (the state is copied with the shards).
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, class T>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, AdamW<T>& optimizer,
                  std::filesystem::path const& dir, std::int64_t step, async_save& saver,
                  std::map<std::string, std::string> const& metadata = {}) {
  detail::sharded_with_state<fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>, T> walked{sharded, optimizer};
  detail::save_fsdp_async(sharded, walked, dir, step, detail::with_steps(metadata, optimizer), saver);
}

/// The model and its AdamW state under FSDP x TP, asynchronously through `saver`.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, class T, device_mesh TpMesh>
void save_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, AdamW<T>& optimizer,
                  TpMesh const& tp, std::filesystem::path const& dir, std::int64_t step, async_save& saver,
                  std::map<std::string, std::string> const& metadata = {}) {
  detail::sharded_with_state<fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>, T> walked{sharded, optimizer};
  detail::save_fsdp_async(sharded, walked, dir, step, detail::with_steps(metadata, optimizer), saver, tp);
}

/// Loads a sharded checkpoint, saved under any dp x tp (or tensor parallelism alone), into a model under FSDP:
/// each rank reads only the boxes that meet its shards. Errors are raised alike on every rank. Returns the
/// checkpoint's index (step, metadata).
template <module Model, class Policy, class ShardMesh, class ReplicateMesh>
checkpoint_index load_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded,
                              std::filesystem::path const& dir, load_options const& options = {}) {
  return detail::load_fsdp(sharded, sharded, dir, detail::fsdp_load_options(sharded, "load_sharded", options));
}

/// load_sharded into a model under FSDP x TP; `tp` is the mesh the model was parallelized over.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, device_mesh TpMesh>
checkpoint_index load_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, TpMesh const& tp,
                              std::filesystem::path const& dir, load_options const& options = {}) {
  return detail::load_fsdp(sharded, sharded, dir, detail::fsdp_load_options(sharded, "load_sharded", options, tp), tp);
}

/// Loads the model and the AdamW state saved with it (save_sharded with the optimizer), under any dp x tp:
/// the moments reshard as the parameters do, and the optimizer's step count is restored.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, class T>
checkpoint_index load_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, AdamW<T>& optimizer,
                              std::filesystem::path const& dir, load_options const& options = {}) {
  detail::sharded_with_state<fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>, T> walked{sharded, optimizer};
  auto index = detail::load_fsdp(sharded, walked, dir, detail::fsdp_load_options(sharded, "load_sharded", options));
  detail::resume_steps(optimizer, index, dir);
  return index;
}

/// The model and its AdamW state under FSDP x TP; `tp` is the mesh the model was parallelized over.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, class T, device_mesh TpMesh>
checkpoint_index load_sharded(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded, AdamW<T>& optimizer,
                              TpMesh const& tp, std::filesystem::path const& dir, load_options const& options = {}) {
  detail::sharded_with_state<fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>, T> walked{sharded, optimizer};
  auto index =
      detail::load_fsdp(sharded, walked, dir, detail::fsdp_load_options(sharded, "load_sharded", options, tp), tp);
  detail::resume_steps(optimizer, index, dir);
  return index;
}

/// Loads one file of full tensors (`shardwise consolidate`'s, or a Hugging Face model.safetensors with
/// `names` = sw::transformers_llama_name) into a model under FSDP: each rank reads only its rows, so no rank
/// holds more than its shards. Returns the file's metadata.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh>
std::map<std::string, std::string> load_consolidated(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded,
                                                     std::filesystem::path const& file,
                                                     std::function<std::string(std::string const&)> const& names = {},
                                                     load_options const& options = {}) {
  auto const checked = detail::fsdp_load_options(sharded, "load_consolidated", options);
  return detail::load_fsdp_file(sharded, detail::single_stage{}, file, names, checked);
}

/// load_consolidated into a model under FSDP x TP; `tp` is the mesh the model was parallelized over.
template <module Model, class Policy, class ShardMesh, class ReplicateMesh, device_mesh TpMesh>
std::map<std::string, std::string> load_consolidated(fully_sharded<Model, Policy, ShardMesh, ReplicateMesh>& sharded,
                                                     TpMesh const& tp, std::filesystem::path const& file,
                                                     std::function<std::string(std::string const&)> const& names = {},
                                                     load_options const& options = {}) {
  auto const checked = detail::fsdp_load_options(sharded, "load_consolidated", options, tp);
  return detail::load_fsdp_file(sharded, tp, file, names, checked);
}

}  // namespace shardwise
