#pragma once
// Checkpoints with the optimizer: the model's sharded checkpoint plus AdamW's moments and step count, written
// in the same atomic commit. Each (dp, tp) rank's state goes to
//   tensor_parallel_shards/dp_rank_XX_tp_rank_YY_pp_rank_00/optimizer.safetensors
// one file per dp rank when ZeRO-1 shards the state over data parallelism (dp_rank_00 alone otherwise, every
// dp replica holding the same state). Tensors "<parameter>.exp_avg" and "<parameter>.exp_avg_sq" hold this
// rank's slice of the flattened local shard; resuming needs the same tp size, dp size and ZeRO-1 setting.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/async_save.hpp"
#include "shardwise/checkpoint/sharded.hpp"
#include "shardwise/core/bounded_json.hpp"
#include "shardwise/nn/optim.hpp"

namespace shardwise {

namespace detail {

[[nodiscard]] inline std::string optimizer_folder(int dp_rank, int tp_rank) {
  char name[64];
  std::snprintf(name, sizeof name, "dp_rank_%02d_tp_rank_%02d_pp_rank_00", dp_rank, tp_rank);
  return std::string("tensor_parallel_shards/") + name;
}

inline constexpr char const* optimizer_file_name = "optimizer.safetensors";

/// The checkpoint names of the model's parameters in the optimizer's order (sw::for_each_parameter's).
template <class Model>
std::vector<std::string> parameter_names(Model& model) {
  std::vector<std::string> names;
  for_each_parameter(model, [&](std::string const& name, auto const&) { names.push_back(name); });
  return names;
}

/// The state of one dp rank, as the file holds it.
template <class T>
struct state_part {
  std::vector<std::uint64_t> starts;
  std::vector<std::vector<T>> m, v;
};

}  // namespace detail

namespace detail {

/// Every dp rank's AdamW state, as copies (under ZeRO-1 each dp rank's slices, gathered on dp rank 0; otherwise
/// dp rank 0's own state): collective over dp.
template <class Model, class T, class DpMesh>
std::shared_ptr<std::vector<state_part<T>>> gather_optimizer_state(Model& model, AdamW<T>& optimizer, DpMesh const& dp,
                                                                   std::size_t names) {
  int const dp_size = dp.size(), dp_rank = dp.rank();
  bool const sliced = optimizer.options().zero1 && dp_size > 1;
  auto parts = std::make_shared<std::vector<state_part<T>>>(static_cast<std::size_t>(sliced ? dp_size : 1));
  optimizer.for_each_state(model, dp, [&](std::size_t index, std::size_t start, std::span<T> m, std::span<T> v) {
    if (index >= names)
      fail(
          "shardwise::save_sharded: the optimizer has more parameters than the model names; save the "
          "optimizer with the model it trains");
    if (!sliced) {
      (*parts)[0].starts.push_back(start);
      (*parts)[0].m.emplace_back(m.begin(), m.end());
      (*parts)[0].v.emplace_back(v.begin(), v.end());
      return;
    }
    for (auto const* moment : {&m, &v}) {
      Eigen::Matrix<T, Eigen::Dynamic, 1> mine =
          Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, 1>>(moment->data(), static_cast<Eigen::Index>(moment->size()));
      Eigen::Matrix<T, Eigen::Dynamic, 1> all;
      all_gather_on(dp.comm(0), mine, all, 0);  // uneven slices, in dp rank order
      if (dp_rank != 0) continue;
      std::size_t offset = 0;
      for (int d = 0; d < dp_size; ++d) {
        auto& part = (*parts)[static_cast<std::size_t>(d)];
        std::size_t const total = static_cast<std::size_t>(all.size());
        std::size_t const n =
            total == 0 ? 0 : chunk_size(total, static_cast<std::size_t>(dp_size), static_cast<std::size_t>(d));
        auto& into = moment == &m ? part.m : part.v;
        into.emplace_back(all.data() + offset, all.data() + offset + n);
        if (moment == &m) part.starts.push_back(offset);
        offset += n;
      }
    }
  });
  return parts;
}

/// The also_write of save_sharded that writes the gathered state's files into the checkpoint being built. It
/// holds what it writes (no reference to the optimizer), so an asynchronous save runs it in the background.
template <class T>
std::function<void(std::filesystem::path const&, int)> optimizer_state_writer(
    std::shared_ptr<std::vector<state_part<T>>> parts, std::vector<std::string> names, std::size_t steps, bool sliced,
    int dp_size, int tp_size) {
  return [parts = std::move(parts), names = std::move(names), steps, sliced, dp_size, tp_size](
             std::filesystem::path const& folder, int tp_rank) {
    for (std::size_t d = 0; d < parts->size(); ++d) {
      safetensors_writer writer;
      auto const& part = (*parts)[d];
      for (std::size_t i = 0; i < part.m.size(); ++i) {
        if (part.m[i].empty()) continue;  // an empty bias, or a slice with no elements
        writer.add<T>(names[i] + ".exp_avg", {part.m[i].size()}, std::span<T const>(part.m[i]));
        writer.add<T>(names[i] + ".exp_avg_sq", {part.v[i].size()}, std::span<T const>(part.v[i]));
      }
      nlohmann::json starts = nlohmann::json::object();
      for (std::size_t i = 0; i < part.m.size(); ++i)
        if (!part.m[i].empty()) starts[names[i]] = part.starts[i];
      auto const path = folder / optimizer_folder(static_cast<int>(d), tp_rank);
      std::filesystem::create_directories(path);
      writer.write(path / optimizer_file_name, {{"format", "pt"},
                                                {"shardwise.optimizer", "AdamW"},
                                                {"shardwise.steps", std::to_string(steps)},
                                                {"shardwise.zero1", sliced ? "1" : "0"},
                                                {"shardwise.dp", std::to_string(sliced ? dp_size : 1)},
                                                {"shardwise.tp", std::to_string(tp_size)},
                                                {"shardwise.starts", starts.dump()}});
    }
  };
}

/// Collectively over dp: gathers the AdamW state (to dp rank 0 under ZeRO-1) and returns the writer of its files,
/// which dp rank 0 hands to the model's save.
template <class Model, class T, class TpMesh, class DpMesh>
std::function<void(std::filesystem::path const&, int)> gathered_optimizer_state_writer(Model& model,
                                                                                       AdamW<T>& optimizer,
                                                                                       TpMesh const& tp,
                                                                                       DpMesh const& dp) {
  bool const sliced = optimizer.options().zero1 && dp.size() > 1;
  auto names = parameter_names(model);
  auto parts = gather_optimizer_state(model, optimizer, dp, names.size());
  return optimizer_state_writer(std::move(parts), std::move(names), optimizer.steps(), sliced, dp.size(), tp.size());
}

}  // namespace detail

/// Saves the model (as save_sharded) and the AdamW state, collectively over the dp x tp mesh: every rank calls
/// it with its tp and dp 1-D meshes. Under ZeRO-1 each dp rank's slice of the moments is sent to dp rank 0,
/// which writes the file of every dp rank; the folder is replaced atomically with all of it.
template <class Model, class T, class TpMesh, class DpMesh>
void save_sharded(Model& model, AdamW<T>& optimizer, TpMesh const& tp, DpMesh const& dp,
                  std::filesystem::path const& dir, std::int64_t step,
                  std::map<std::string, std::string> const& metadata = {}) {
  auto write_state = detail::gathered_optimizer_state_writer(model, optimizer, tp, dp);
  std::string error;
  if (dp.rank() == 0) {
    try {
      save_sharded(model, tp, dir, step, metadata, std::move(write_state));
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  detail::agree_on_errors(dp, error, "saving the model and optimizer state", dir);
}

/// Saves the model and the AdamW state as the overload above does, asynchronously through `saver` (see
/// sw::async_save): collectively over the dp x tp mesh it finishes the saver's previous save, copies the
/// state (gathered on dp rank 0 under ZeRO-1) and dp rank 0's model shards, and returns; dp rank 0's ranks
/// write it all in the background. Every rank's saver then commits it (wait(), poll(), the next save), and a
/// failure is raised on every rank of the dp x tp mesh.
template <class Model, class T, class TpMesh, class DpMesh>
void save_sharded(Model& model, AdamW<T>& optimizer, TpMesh const& tp, DpMesh const& dp,
                  std::filesystem::path const& dir, std::int64_t step, async_save& saver,
                  std::map<std::string, std::string> const& metadata = {}) {
  static_assert(!detail::hands_out_parameter_shards<Model>,
                "shardwise::save_sharded(..., async_save): a model under FSDP shards its optimizer state itself; "
                "call save_sharded(sharded, optimizer, [tp,] dir, step, saver)");
  detail::async_save_access::finish(saver);  // on every rank: its failure is raised here, and this one does not start
  auto write_state = detail::gathered_optimizer_state_writer(model, optimizer, tp, dp);
  std::string error;
  if (dp.rank() == 0) {
    try {
      auto group = detail::owning_save_group(tp);
      group.tp_size = tp.size(), group.tp_rank = tp.rank();
      detail::async_save_access::start(saver, model, std::move(group), dir, step, metadata, std::move(write_state));
    } catch (std::exception const& e) {
      error = e.what();
    }
  }
  detail::agree_on_errors(dp, error, "saving the model and optimizer state", dir);
  detail::async_save_access::extend_over(saver, dp, dir, "saving the model and optimizer state in the background");
}

/// Loads the model (as load_sharded, at any tp size) and the AdamW state saved with it, which needs the tp
/// size, dp size and ZeRO-1 setting it was saved with. Every rank reads only its own state file.
template <class Model, class T, class TpMesh, class DpMesh>
checkpoint_index load_sharded(Model& model, AdamW<T>& optimizer, TpMesh const& tp, DpMesh const& dp,
                              std::filesystem::path const& dir) {
  auto index = load_sharded(model, tp, dir);
  bool const sliced = optimizer.options().zero1 && dp.size() > 1;
  auto const folder = detail::normalized_dir(dir) / detail::optimizer_folder(sliced ? dp.rank() : 0, tp.rank());
  auto const file = folder / detail::optimizer_file_name;
  if (!std::filesystem::exists(file))
    detail::fail("shardwise::load_sharded: \"", detail::normalized_dir(dir).string(),
                 "\" has no optimizer state for dp rank ", sliced ? dp.rank() : 0, ", tp rank ", tp.rank(), " (no \"",
                 file.string(),
                 "\"); resume with the tp and dp sizes and the ZeRO-1 setting it was saved with, or "
                 "load the model alone");
  safetensors_file in(file.string());
  auto const& meta = in.metadata();
  auto value = [&](char const* key) {
    auto const found = meta.find(key);
    if (found == meta.end())
      detail::fail("shardwise::load_sharded: \"", file.string(), "\": metadata \"", key,
                   "\" is missing; this is not a shardwise optimizer state file");
    return found->second;
  };
  std::string const want_dp = std::to_string(sliced ? dp.size() : 1), want_tp = std::to_string(tp.size());
  if (value("shardwise.zero1") != (sliced ? "1" : "0") || value("shardwise.dp") != want_dp ||
      value("shardwise.tp") != want_tp)
    detail::fail("shardwise::load_sharded: \"", file.string(), "\": optimizer state saved at tp ",
                 value("shardwise.tp"), ", dp ", value("shardwise.dp"), " (ZeRO-1 ", value("shardwise.zero1"),
                 ") cannot resume at tp ", want_tp, ", dp ", want_dp, " (ZeRO-1 ", sliced ? "1" : "0",
                 "); resume with the sizes it was saved with");
  auto const bad_starts = [&](auto const&... why) {
    detail::fail("shardwise::load_sharded: \"", file.string(), "\": its shardwise.starts ", why...,
                 "; the file is corrupt: save it again");
  };
  auto const starts = detail::parse_bounded_json(
      value("shardwise.starts"), 2, [&](std::size_t depth) { bad_starts("nest JSON ", depth, " deep"); },
      [&](std::string const& reason) { bad_starts("are not valid JSON (", reason, ")"); });
  auto const names = detail::parameter_names(model);
  optimizer.for_each_state(model, dp, [&](std::size_t index, std::size_t start, std::span<T> m, std::span<T> v) {
    if (m.empty()) return;
    std::string const& name = names.at(index);
    if (!starts.contains(name) || starts.at(name).template get<std::uint64_t>() != start)
      detail::fail("shardwise::load_sharded: \"", file.string(), "\": tensor \"", name,
                   "\" has no optimizer state for this rank's slice (elements from ", start,
                   "); resume with the model and sizes it was saved with");
    for (auto [moment, suffix] : {std::pair{m, ".exp_avg"}, std::pair{v, ".exp_avg_sq"}}) {
      std::string const stored = name + suffix;
      if (!(in.shape(stored) == extents{moment.size()}))
        detail::fail("shardwise::load_sharded: \"", file.string(), "\": tensor \"", stored, "\" does not hold ",
                     moment.size(), " elements; resume with the model and sizes it was saved with");
      in.read_box(stored, extents{0}, extents{moment.size()}, moment.data());
    }
  });
  optimizer.set_steps(static_cast<std::size_t>(std::stoull(value("shardwise.steps"))));
  return index;
}

}  // namespace shardwise
