#pragma once
// Checkpoints with the optimizer: the model's sharded checkpoint plus AdamW's moments and step count, in the same
// atomic commit. Each parameter's moments are tensors "optimizer.<parameter>.exp_avg" and ".exp_avg_sq", cut over
// tp as the parameter is and written beside it (under ZeRO-1 the dp ranks' slices are gathered first) — the names
// and cuts a model under FSDP saves (fsdp/checkpoint.hpp). So the state reshards on load as the parameters do:
// a checkpoint saved at one dp x tp x pp, with ZeRO-1 or without, or under FSDP, resumes at another.
#include <charconv>
#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/async_save.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/sharded.hpp"
#include "shardwise/nn/training/optim.hpp"
#include "shardwise/nn/walk.hpp"

namespace shardwise {

namespace detail {

/// What optimizer steps a checkpoint saved with the state had taken (index metadata).
inline constexpr char const* optimizer_steps_key = "shardwise.optimizer_steps";
/// The optimizer's learning-rate schedule (index metadata, detail::schedule_text), restored with the steps.
inline constexpr char const* optimizer_schedule_key = "shardwise.lr_schedule";

/// Refuses, by name, a checkpoint saved without the optimizer's state (`file`: its index), or with it in the
/// per-rank files of shardwise before the state resharded (0.1.0's optimizer.safetensors), which this one does not
/// read.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void check_has_optimizer_state(checkpoint_index const& index,
                                                                 std::string const& file);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void check_has_optimizer_state(checkpoint_index const& index,
                                                                 std::string const& file) {
  if (index.metadata.contains(optimizer_steps_key)) return;
  auto const old_file = std::filesystem::path(file).parent_path() /
                        "tensor_parallel_shards/dp_rank_00_tp_rank_00_pp_rank_00/optimizer.safetensors";
  if (std::filesystem::exists(old_file))
    fail("shardwise::load_sharded: \"", file, "\" keeps its optimizer state in per-rank files (\"", old_file.string(),
         "\"), shardwise's earlier format, which this version does not read; load the model alone, or resume with the "
         "earlier version and save again");
  fail("shardwise::load_sharded: \"", file,
       "\" holds no optimizer state (it was saved without the optimizer); load the model alone");
}
#endif

/// Sets the optimizer's step count, and its schedule where the checkpoint keeps one (as torch's
/// LRScheduler.load_state_dict does), from a checkpoint saved with its state.
template <class T>
void resume_steps(AdamW<T>& optimizer, checkpoint_index const& index, std::filesystem::path const& dir) {
  check_has_optimizer_state(index, (dir / checkpoint_index_name).string());
  std::string const& text = index.metadata.at(optimizer_steps_key);
  std::size_t steps = 0;
  auto const [end, failed] = std::from_chars(text.data(), text.data() + text.size(), steps);
  if (failed != std::errc{} || end != text.data() + text.size())
    fail("shardwise::load_sharded: \"", (dir / checkpoint_index_name).string(), "\": its ", optimizer_steps_key, " \"",
         text, "\" is not a number of steps; the checkpoint is damaged: save it again");
  optimizer.set_steps(steps);
  auto const schedule = index.metadata.find(optimizer_schedule_key);
  if (schedule == index.metadata.end()) return;  // saved before schedules: the optimizer keeps its own
  LearningRateSchedule saved;
  if (!read_schedule_text(schedule->second, saved))
    fail("shardwise::load_sharded: \"", (dir / checkpoint_index_name).string(), "\": its ", optimizer_schedule_key,
         " \"", schedule->second, "\" is not a learning-rate schedule; the checkpoint is damaged: save it again");
  optimizer.set_schedule(saved);
}

/// The checkpoint's metadata with the optimizer's step count and schedule.
template <class T>
std::map<std::string, std::string> with_steps(std::map<std::string, std::string> metadata, AdamW<T> const& optimizer) {
  metadata[optimizer_steps_key] = std::to_string(optimizer.steps());
  metadata[optimizer_schedule_key] = schedule_text(optimizer.options().schedule);
  return metadata;
}

/// A parameter's name in checkpoints: a pipeline stage's copy of another stage's weight goes by its owner's.
template <class P>
std::string checkpoint_name(std::string const& name, P const& p) {
  return p.mirror_of.empty() ? name : std::string(p.mirror_of);
}

/// A parameter's first and second moments, whole on this rank (its tp shard), shaped as its local storage.
template <class T>
struct whole_moments {
  nn::matrix<T> m, v;
};

/// Zeroed moments for every parameter of the model's list, in the order of sw::for_each_parameter (AdamW's).
template <class T>
std::vector<whole_moments<T>> blank_moments(model_list<T> const& list) {
  std::vector<whole_moments<T>> moments;
  for (listed_parameter<T> const& p : list.parameters) {
    if (p.frozen) continue;  // no state (sw::freeze)
    auto const rows = p.value.rows(), cols = p.value.cols();
    moments.push_back({nn::matrix<T>::Zero(rows, cols), nn::matrix<T>::Zero(rows, cols)});
  }
  return moments;
}

/// Collectively over dp: every parameter's moments whole on this rank's tp shard (under ZeRO-1 the dp ranks'
/// slices, gathered in dp rank order, which is the flattened shard's), kept where `keep` (the writer) only. A
/// state that does not fit the model is raised on every dp rank, after the gathers every rank makes.
template <class T, class DpMesh>
std::vector<whole_moments<T>> gather_moments(model_list<T> const& list, AdamW<T>& optimizer, DpMesh const& dp,
                                             bool keep, std::filesystem::path const& dir) {
  auto moments = keep ? blank_moments<T>(list) : std::vector<whole_moments<T>>{};
  bool const sliced = optimizer.options().zero1 && dp.size() > 1;
  using vector = Eigen::Matrix<T, Eigen::Dynamic, 1>;
  std::string error;
  optimizer.for_each_state(list, dp, [&](std::size_t index, std::size_t, std::span<T> m, std::span<T> v) {
    if (!keep && !sliced) return;  // nothing to send, nothing kept
    for (auto [moment, which] : {std::pair{m, &whole_moments<T>::m}, std::pair{v, &whole_moments<T>::v}}) {
      vector whole = Eigen::Map<vector const>(moment.data(), static_cast<Eigen::Index>(moment.size()));
      if (sliced) {
        vector const mine = std::move(whole);
        all_gather_on(dp.comm(0), mine, whole, 0);  // uneven slices, in dp rank order
      }
      if (!keep || !error.empty()) continue;
      if (index >= moments.size() || whole.size() != (moments[index].*which).size()) {
        error = concat("shardwise::save_sharded: the optimizer's state of parameter ", index,
                       " does not fit the model's parameters; save the optimizer with the model it trains");
        continue;
      }
      std::copy(whole.data(), whole.data() + whole.size(), (moments[index].*which).data());
    }
  });
  agree_on_errors(dp, error, "gathering the optimizer state", dir);
  return moments;
}

/// Each rank's part of the whole moments into the optimizer: its ZeRO-1 slice, or all of them.
template <class T, class DpMesh>
void take_moments(model_list<T> const& list, AdamW<T>& optimizer, DpMesh const& dp,
                  std::vector<whole_moments<T>> const& whole) {
  optimizer.for_each_state(list, dp, [&](std::size_t index, std::size_t start, std::span<T> m, std::span<T> v) {
    if (index >= whole.size() || start + m.size() > static_cast<std::size_t>(whole[index].m.size()))
      fail("shardwise::load_sharded: the optimizer's state of parameter ", index,
           " does not fit the model's; load into the optimizer that trains this model");
    std::copy_n(whole[index].m.data() + start, m.size(), m.data());
    std::copy_n(whole[index].v.data() + start, v.size(), v.data());
  });
}

/// Saves a model whose experts are placed over the dp ranks (its ep ranks), with its state, collectively over dp x tp:
/// dp rank 0 writes what it holds, every other dp rank only its own experts, each in its own rank files; the
/// index lists every expert by its index in the whole model, so the checkpoint loads at any ep size.
template <class Walked, class TpMesh, class DpMesh>
void save_placed_experts(Walked& walked, TpMesh const& tp, DpMesh const& dp, std::filesystem::path const& dir,
                         std::int64_t step, std::map<std::string, std::string> const& metadata) {
  auto group = save_group_over(tp, dp);
  group.tp_size = tp.size(), group.tp_rank = tp.rank(), group.dp_size = dp.size(), group.dp_rank = dp.rank();
  group.placed_only = dp.rank() != 0;
  save_sharded_stage(tensors_of(walked), group, dir, step, metadata, {});
}

/// Runs `write` on dp rank 0 (the replica that writes) and raises its failure, if any, on every dp rank.
template <class DpMesh, class Write>
void on_dp_rank0(DpMesh const& dp, std::filesystem::path const& dir, std::string_view stage, Write&& write) {
  std::string error;
  if (dp.rank() == 0) {
    try {
      write();
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  agree_on_errors(dp, error, stage, dir);
}

/// listed_with_state's walk over the model's list: every parameter, then the moments of the trained ones (sized
/// first when `loading`), as fn(name, parameter, rows, cols, first row, value).
template <class T, class Fn>
void for_each_tensor_with_moments(model_list<T> const& list, std::vector<whole_moments<T>>& moments, bool loading,
                                  Fn& fn) {
  for (listed_layer const& l : list.layers) materialized_for_checkpoint(l, loading);
  for (listed_parameter<T> const& p : list.parameters) {
    auto const rows = p.value.rows(), cols = p.value.cols();
    if (p.value.matrix)
      fn(checkpoint_name(p.name, p), p, rows, cols, 0, *p.value.matrix);
    else
      fn(checkpoint_name(p.name, p), p, rows, cols, 0, *p.value.vector);
  }
  std::size_t i = 0;
  for (listed_parameter<T> const& p : list.parameters) {
    if (p.frozen) continue;  // no state (sw::freeze)
    auto const rows = p.value.rows(), cols = p.value.cols();
    if (loading && i == moments.size())
      moments.push_back({nn::matrix<T>::Zero(rows, cols), nn::matrix<T>::Zero(rows, cols)});
    if (i == moments.size() || moments[i].m.rows() != rows || moments[i].m.cols() != cols)
      fail("shardwise::save_sharded: the optimizer's state does not fit parameter \"", p.name,
           "\"; save the optimizer with the model it trains");
    auto& [m, v] = moments[i++];
    std::string const stored = concat(optimizer_state_prefix, checkpoint_name(p.name, p));
    fn(stored + ".exp_avg", p, rows, cols, 0, m);
    fn(stored + ".exp_avg_sq", p, rows, cols, 0, v);
  }
}

/// A model (or pipeline stage) not under FSDP with its AdamW moments, walked as one checkpoint: the parameters,
/// then their moments as tensors "optimizer.<parameter>.exp_avg" / ".exp_avg_sq" cut as the parameter is. A load
/// (`loading`) materializes lazily declared layers and sizes the moments as it walks them. It holds the model's
/// list, not the model, so that the checkpoints' walks of it are compiled once per element type (with_state).
template <class T>
struct listed_with_state {
  model_list<T> list;                     ///< The model's parameters, named.
  std::vector<whole_moments<T>> moments;  ///< In the order of sw::for_each_parameter.
  bool loading = false;
  std::optional<std::map<std::string, std::string>> config;  ///< The model's shardwise_config(), if it states one.
  std::function<bool(std::string_view)> other_stage;         ///< A pipeline stage's: whether a tensor is another's.

  /// What the walk hands out lives as long as this: a save borrows it, as it borrows a model's parameters.
  static constexpr bool shardwise_values_outlive_walk = true;

  template <class Fn>
  void shardwise_for_each_parameter_shard(Fn&& fn) {
    for_each_tensor_with_moments(list, moments, loading, fn);
  }
  /// For loaders: a checkpoint saved without the optimizer is refused by name, not as a missing tensor.
  void shardwise_check_index(checkpoint_index const& index, std::string const& file) const {
    check_has_optimizer_state(index, file);
  }
  [[nodiscard]] std::optional<std::map<std::string, std::string>> shardwise_config() const { return config; }
  /// For pipeline stages: another stage's tensors are not this one's to read.
  [[nodiscard]] bool shardwise_other_stage(std::string_view name) const { return other_stage && other_stage(name); }
};

/// The model's listed_with_state: its list, with what its checkpoints ask of it beside (configuration, stage).
template <class T, class Model>
listed_with_state<T> with_state(Model& model, bool loading) {
  listed_with_state<T> walked{list_model<T>(model, {.names = true}), {}, loading, {}, {}};
  if constexpr (requires { model.shardwise_config(); }) walked.config = model.shardwise_config();
  if constexpr (requires { model.shardwise_other_stage(std::string_view()); })
    walked.other_stage = [&model](std::string_view name) { return model.shardwise_other_stage(name); };
  return walked;
}

}  // namespace detail

/// Saves the model (as save_sharded) and its AdamW state, collectively over the dp x tp mesh: every rank calls it
/// with its tp and dp 1-D meshes. Under ZeRO-1 the dp ranks' slices of the moments are gathered on dp rank 0,
/// which writes them with the model, cut over tp as the parameters; the folder is replaced atomically with all
/// of it. The state then resumes at any dp x tp, with ZeRO-1 or without, or under FSDP.
template <class Model, class T, class TpMesh, class DpMesh>
void save_sharded(Model& model, AdamW<T>& optimizer, TpMesh const& tp, DpMesh const& dp,
                  std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  static_assert(!detail::hands_out_parameter_shards<Model>,
                "shardwise::save_sharded(model, optimizer, tp, dp, ...): a model under FSDP shards its optimizer "
                "state itself; call save_sharded(sharded, optimizer, [tp,] dir, step)");
  expert_parallel const* const placement = detail::experts_placement(model);
  bool const placed = placement != nullptr;  // then every ep rank writes its own experts
  if (placed && placement->replicas() > 1)
    detail::fail(
        "shardwise::save_sharded: the model's experts are placed over ep ranks with replicas (sw::"
        "expert_parallelize(model, ep, replicas)), whose saves are not built yet; save a model placed over "
        "all its dp ranks, or unplaced");
  auto walked = detail::with_state<T>(model, false);
  walked.moments = detail::gather_moments(walked.list, optimizer, dp, placed || dp.rank() == 0, dir);
  if (placed) return detail::save_placed_experts(walked, tp, dp, dir, step, detail::with_steps(metadata, optimizer));
  detail::on_dp_rank0(dp, dir, "saving the model and optimizer state",
                      [&] { save_sharded(walked, tp, dir, step, detail::with_steps(metadata, optimizer)); });
}

/// Saves a pipeline stage and its AdamW state, collectively over tp, the pipeline axis `pp` and the stage's dp
/// replicas (every rank calls it with its stage): dp rank 0 of each stage writes as save_sharded(stage, tp, pp,
/// ...) does, with the moments beside the parameters, so the checkpoint resumes at any pp, tp and dp.
template <class Model, class T, class TpMesh, class PpMesh, class DpMesh>
  requires requires(PpMesh const& pp) { pp.comm(0); }
void save_sharded(Model& stage, AdamW<T>& optimizer, TpMesh const& tp, PpMesh const& pp, DpMesh const& dp,
                  std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  static_assert(!detail::hands_out_parameter_shards<Model>,
                "shardwise::save_sharded(stage, optimizer, tp, pp, dp, ...): a model under FSDP shards its optimizer "
                "state itself; call save_sharded(sharded, optimizer, [tp,] dir, step)");
  if (detail::placed_experts_in(stage))  // dp rank 0 writes each stage: the other ep ranks' experts would be lost
    detail::fail(
        "shardwise::save_sharded(stage, optimizer, tp, pp, dp, ...): the stage's experts are placed over ep "
        "ranks (sw::expert_parallelize), whose saves of pipeline stages are not built yet; save the stages "
        "unplaced");
  auto walked = detail::with_state<T>(stage, false);
  walked.moments = detail::gather_moments(walked.list, optimizer, dp, dp.rank() == 0, dir);
  detail::on_dp_rank0(dp, dir, "saving the stage and optimizer state",
                      [&] { save_sharded(walked, tp, pp, dir, step, detail::with_steps(metadata, optimizer)); });
}

/// Saves the model and the AdamW state as the overload above does, asynchronously through `saver` (see
/// sw::async_save): collectively over the dp x tp mesh it finishes the saver's previous save, gathers the state
/// on dp rank 0, copies it with dp rank 0's model shards, and returns; dp rank 0's ranks write it all in the
/// background. Every rank's saver then commits it (wait(), poll(), the next save), and a failure is raised on
/// every rank of the dp x tp mesh.
template <class Model, class T, class TpMesh, class DpMesh>
void save_sharded(Model& model, AdamW<T>& optimizer, TpMesh const& tp, DpMesh const& dp,
                  std::filesystem::path const& dir, std::int64_t step, async_save& saver,
                  std::map<std::string, std::string> const& metadata = {}) {
  static_assert(!detail::hands_out_parameter_shards<Model>,
                "shardwise::save_sharded(..., async_save): a model under FSDP shards its optimizer state itself; "
                "call save_sharded(sharded, optimizer, [tp,] dir, step, saver)");
  detail::async_save_access::finish(saver);  // on every rank: its failure is raised here, and this one does not start
  if (detail::placed_experts_in(model))
    detail::fail(
        "shardwise::save_sharded(..., async_save): asynchronous saves of experts placed over ep ranks are "
        "not built yet; save them with save_sharded(model, optimizer, tp, dp, dir, step)");
  auto walked = detail::with_state<T>(model, false);
  walked.moments = detail::gather_moments(walked.list, optimizer, dp, dp.rank() == 0, dir);
  detail::on_dp_rank0(dp, dir, "saving the model and optimizer state", [&] {
    auto group = detail::owning_save_group(tp);
    group.tp_size = tp.size(), group.tp_rank = tp.rank();
    detail::async_save_access::start(saver, walked, std::move(group), dir, step,
                                     detail::with_steps(metadata, optimizer), {});
  });
  detail::async_save_access::extend_over(saver, dp, dir, "saving the model and optimizer state in the background");
}

/// Loads the model (or a pipeline stage: its own tensors) and the AdamW state saved with it, whatever dp, tp and
/// pp sizes and ZeRO-1 setting saved them, or FSDP: every rank reads its tp shard of each parameter's moments and
/// keeps its ZeRO-1 slice of them (or all), and the optimizer's step count is restored. Errors are raised alike
/// on every rank of the dp x tp mesh.
template <class Model, class T, class TpMesh, class DpMesh>
checkpoint_index load_sharded(Model& model, AdamW<T>& optimizer, TpMesh const& tp, DpMesh const& dp,
                              std::filesystem::path const& dir, load_options const& options = {}) {
  static_assert(!detail::hands_out_parameter_shards<Model>,
                "shardwise::load_sharded(model, optimizer, tp, dp, ...): a model under FSDP shards its optimizer "
                "state itself; call load_sharded(sharded, optimizer, [tp,] dir)");
  auto walked = detail::with_state<T>(model, true);
  auto index = detail::load_sharded_agreed(walked, tp, dir, options, tp, dp);
  std::string error;
  try {
    detail::take_moments(walked.list, optimizer, dp, walked.moments);
    detail::resume_steps(optimizer, index, dir);
  } catch (std::exception const& e) {
    error = e.what();
  }
  detail::agree_on_errors_across(error, "taking the optimizer state", dir, "load_sharded", tp, dp);
  return index;
}

}  // namespace shardwise
