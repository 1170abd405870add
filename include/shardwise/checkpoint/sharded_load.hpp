#pragma once
// Loading sharded checkpoints into a parallelized (or lazily declared) model, resharded to its tp size:
// load_sharded, load_options, and the loader that load_consolidated and load_pretrained
// (checkpoint/pretrained.hpp) share. See checkpoint/sharded.hpp.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/checkpoint/checkpoint_reader.hpp"
#include "shardwise/checkpoint/compiled_once.hpp"
#include "shardwise/checkpoint/load_verdict.hpp"
#include "shardwise/checkpoint/model_tensors.hpp"
#include "shardwise/checkpoint/node_reader.hpp"
#include "shardwise/checkpoint/read_turns.hpp"
#include "shardwise/checkpoint/relay.hpp"
#include "shardwise/checkpoint/safetensors_read.hpp"
#include "shardwise/checkpoint/sharded_index.hpp"
#include "shardwise/checkpoint/sharded_layout.hpp"
#include "shardwise/checkpoint/verify.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/nn/lazy.hpp"

namespace shardwise {
/// Options of load_sharded, load_consolidated and load_pretrained.
struct load_options {
  /// How many ranks read at once (optimum-neuron's num_local_ranks_per_step): the others wait their turn, which
  /// bounds the concurrent disk and page-cache load. Among the load's tp ranks, or among `turns`' ranks when set
  /// (sw::node_turns(world): every rank of the node). 0: all at once, with no communication at all.
  int ranks_per_step = 0;
  /// The RAM-efficient mode: only tp rank 0 opens the files (under FSDP, the first rank of dp x tp; with `turns`
  /// from sw::node_turns, the node's first rank, for every rank of the node); it reads one block at a time and
  /// sends every other rank its shard (the others never touch the disk nor hold more than their shard).
  bool only_rank0_reads = false;
  /// Strict (transformers' load_state_dict(strict=True)): a model tensor the checkpoint lacks, or a checkpoint
  /// tensor no model tensor reads, is an error naming it. Non-strict: such tensors are skipped — a missing one
  /// keeps its current value (zeros in a sw::Lazy model) — and load_pretrained reports them.
  bool strict = true;
  /// Check every piece a rank reads against the checksum its save recorded (the piece is read whole once for
  /// that); off: only the boxes the rank needs are read.
  bool verify_checksums = true;
  /// The ranks that take turns under ranks_per_step, or share one reader under only_rank0_reads
  /// (sw::node_turns(world): this node's, across tp groups, data-parallel replicas and pipeline stages; every one
  /// of them must load the same checkpoint with the same options); null: the load's tp ranks.
  std::shared_ptr<read_turns const> turns;
};

namespace detail {

/// The generation in dir's index, or 0 if it cannot be read.
inline std::uint64_t current_generation(std::filesystem::path const& dir) {
  try {
    return read_checkpoint_index(dir).generation;
  } catch (std::exception const&) {
    return 0;
  }
}

/// What load_into found: the index it read, and (non-strict) the model tensors it left as they were and the
/// checkpoint tensors it did not read.
struct load_outcome {
  checkpoint_index index;
  std::vector<std::string> missing, unexpected;
};

/// One load: where the checkpoint is (set by the caller's locate), what was asked and what was found.
struct load_state {
  std::filesystem::path source;  ///< The folder the pieces' files are relative to.
  std::string index_file;        ///< The file errors name.
  std::string_view who;          ///< "load_sharded", "load_pretrained", ...
  load_options options;
  load_outcome outcome;
};

/// How many ranks take turns under ranks_per_step, and this rank's place among them: options.turns', or tp's.
template <class TpMesh>
int turn_size(TpMesh const& tp, load_options const& options) {
  return options.turns ? options.turns->size : tp.size();
}
template <class TpMesh>
int turn_rank(TpMesh const& tp, load_options const& options) {
  return options.turns ? options.turns->rank : tp.rank();
}

/// How the ranks of one load read: each its own shard at once; in turns of ranks_per_step; tp rank 0 reading
/// for all and sending each its shard; FSDP's first rank reading and relaying over dp x tp; the node's first
/// rank reading for the node.
enum class load_mode { each_rank, in_turns, rank0_sends, rank0_relays, node_reads };

template <class Axes, class TpMesh>
load_mode load_mode_of(Axes const& axes, TpMesh const& tp, load_options const& options) {
  if (options.only_rank0_reads && options.turns && options.turns->size > 1) {
    if (!options.turns->send || !options.turns->receive)
      fail(
          "shardwise::load_options: only_rank0_reads over `turns` needs turns that can send and receive; build "
          "them with sw::node_turns(world)");
    return load_mode::node_reads;
  }
  if constexpr (Axes::fully_sharded) {  // a model under FSDP: its shards span dp x tp
    if (options.only_rank0_reads && axes.ranks() > 1) return load_mode::rank0_relays;
  } else if constexpr (requires { tp.comm(0); }) {
    if (options.only_rank0_reads && tp.size() > 1) return load_mode::rank0_sends;
  }
  bool const in_turns = options.ranks_per_step > 0 && options.ranks_per_step < turn_size(tp, options);
  return in_turns ? load_mode::in_turns : load_mode::each_rank;
}

/// The model's tensors against the checkpoint's: the same tensors (unless non-strict), the same global shapes,
/// floating types. Lists the model's tensor names in `in_model`.
inline void check_model_tensors(model_tensors const& model, int size, int rank, load_state& s,
                                std::set<std::string>& in_model) {
  model.for_each(size, rank, true, [&](tensor_layout const& t, tensor_values const&) {
    in_model.insert(t.name);
    checkpoint_tensor const* c = s.outcome.index.find(t.name);
    if (!c && !s.options.strict) {
      s.outcome.missing.push_back(t.name);
      return;
    }
    if (!c)
      fail("shardwise::", s.who, ": \"", s.index_file, "\": the model's tensor \"", t.name,
           "\" is not in the checkpoint; load a checkpoint saved from this model, or pass "
           "load_options{.strict = false} to keep its current value");
    if (c->shape != t.stored_shape())
      fail("shardwise::", s.who, ": \"", s.index_file, "\": tensor \"", t.name, "\" has shape ", shape_text(c->shape),
           " in the checkpoint but ", shape_text(t.stored_shape()),
           " in the model; load a checkpoint of the same model configuration");
    if (!is_floating(c->type))
      fail("shardwise::", s.who, ": \"", s.index_file, "\": tensor \"", t.name, "\" is stored as ", dtype_name(c->type),
           ", not a floating type; load a checkpoint of this model");
  });
}

/// The checkpoint's tensors that no model tensor reads: an error when strict, else listed as unexpected.
inline void check_checkpoint_tensors(model_tensors const& model, load_state& s, std::set<std::string> const& in_model) {
  for (auto const& c : s.outcome.index.tensors) {
    if (in_model.count(c.name) || c.name.starts_with(optimizer_state_prefix)) continue;
    if (model.other_stage && model.other_stage(c.name)) continue;  // a pipeline stage reads only its own tensors
    if (s.options.strict)
      fail("shardwise::", s.who, ": \"", s.index_file, "\": the checkpoint's tensor \"", c.name,
           "\" is not in the model; load the checkpoint into the model it was saved from, or pass "
           "load_options{.strict = false} to skip it");
    s.outcome.unexpected.push_back(c.name);
  }
}

/// A model that states its configuration must have the checkpoint's: the same shapes can mean other weights.
inline void check_configuration(model_tensors const& model, load_state const& s) {
  if (model.config) {
    for (auto const& [field, value] : *model.config) {
      auto const saved = s.outcome.index.config.find(field);
      if (saved != s.outcome.index.config.end() && saved->second != value)
        fail("shardwise::", s.who, ": \"", s.index_file, "\": the checkpoint was saved from a model with ", field,
             " = ", saved->second, " but this model has ", field, " = ", value,
             "; build the model with the checkpoint's configuration");
    }
  }
}

/// Every file a piece names must be there.
inline void check_piece_files(load_state const& s) {
  for (auto const& c : s.outcome.index.tensors)
    for (auto const& p : c.pieces)
      if (!std::filesystem::exists(s.source / p.file))
        fail("shardwise::", s.who, ": \"", (s.source / p.file).string(), "\" is missing (tensor \"", c.name,
             "\" has a piece there): the rank folder \"", std::filesystem::path(p.file).parent_path().string(),
             "\" is gone; restore it, or load another checkpoint");
}

/// How a load finds its checkpoint: locate(source, index, label, unexpected) sets the folder its pieces' files are
/// relative to, the index, the file to name in errors, and the file's tensors it leaves unread.
using checkpoint_locator =
    std::function<void(std::filesystem::path&, checkpoint_index&, std::string&, std::vector<std::string>&)>;

/// Locates the checkpoint and compares it with the model.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void check_against_model(model_tensors const& model, int size, int rank,
                                                           load_state& s, checkpoint_locator const& locate);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void check_against_model(model_tensors const& model, int size, int rank,
                                                           load_state& s, checkpoint_locator const& locate) {
  s.outcome.missing.clear();
  s.outcome.unexpected.clear();
  locate(s.source, s.outcome.index, s.index_file, s.outcome.unexpected);
  if (model.check_index)
    model.check_index(s.outcome.index, s.index_file);  // what it needs beyond its tensors (optimizer state)
  std::set<std::string> in_model;
  check_model_tensors(model, size, rank, s, in_model);
  check_checkpoint_tensors(model, s, in_model);
  check_configuration(model, s);
  check_piece_files(s);
}
#endif

/// The ranks a load agrees over: tp's, for a model whose tensors lie whole or cut on them. The same for every such
/// model, so that the loader below is compiled once per tp mesh, not once per model.
template <class TpMesh>
struct tp_load_axes {
  static constexpr bool fully_sharded = false;
  TpMesh const& tp;
  /// Every rank passes its error (empty if none); if any failed, every rank throws the same one.
  void agree(std::string const& error, std::string_view stage, std::filesystem::path const& dir,
             std::string_view who) const {
    if constexpr (requires { tp.comm(0); })
      agree_on_errors(tp, error, stage, dir, who);
    else
      agree_on_errors_across(error, stage, dir, who);  // one rank: its own error
  }
};

/// A model under FSDP: its shards span its data mesh and tp, and its first rank can relay them to the others.
template <class Model, class TpMesh>
struct fsdp_load_axes {
  static constexpr bool fully_sharded = true;
  Model& model;
  TpMesh const& tp;
  void agree(std::string const& error, std::string_view stage, std::filesystem::path const& dir,
             std::string_view who) const {
    with_fsdp_axes(model, tp, [&](auto const&... axes) { agree_on_errors_across(error, stage, dir, who, axes...); });
  }
  [[nodiscard]] int ranks() const {
    return with_fsdp_axes(model, tp, [](auto const&... axes) { return (1 * ... * axes.size()); });
  }
  /// The first rank reads every rank's block and relays it over dp x tp.
  void relay(checkpoint_reader& reader, checkpoint_index const& index, std::filesystem::path const& dir,
             std::string_view who) const;
};

/// The axes of a load into `model`.
template <class Model, class TpMesh>
auto load_axes_of(Model& model, TpMesh const& tp) {
  if constexpr (requires { model.data_mesh(); })
    return fsdp_load_axes<Model, TpMesh>{model, tp};
  else
    return tp_load_axes<TpMesh>{tp};
}

/// Runs `check`; where the ranks go on to communicate, its error is agreed first (over the node too when its
/// first rank reads for it), so that every rank raises it and none waits for a peer that will not come.
template <class Axes, class Check>
void check_agreed(Axes const& axes, load_mode mode, load_options const& options, std::filesystem::path const& dir,
                  std::string_view who, Check&& check) {
  bool const agreed = mode == load_mode::rank0_relays || mode == load_mode::node_reads ||
                      (!Axes::fully_sharded && mode != load_mode::each_rank);
  if (!agreed) return check();
  std::string error;
  try {
    check();
  } catch (std::exception const& e) {
    error = e.what();
  }
  if (mode == load_mode::node_reads) error = node_agreed_error(*options.turns, error);
  axes.agree(error, "checking the checkpoint against the model", dir, who);
}

/// Each of the model's tensors that the checkpoint holds: zeroed, then its shard read.
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void read_shard(model_tensors const& model, int size, int rank,
                                                  checkpoint_reader& reader, checkpoint_index const& index);
#if SHARDWISE_DETAIL_CHECKPOINT_BODIES
SHARDWISE_DETAIL_CHECKPOINT_ENTRY void read_shard(model_tensors const& model, int size, int rank,
                                                  checkpoint_reader& reader, checkpoint_index const& index) {
  if (checkpoint_load_hook) checkpoint_load_hook("read_begin", rank);
  model.for_each(size, rank, true, [&](tensor_layout const& t, tensor_values const& value) {
    if (!index.find(t.name)) return;  // missing (non-strict): keeps its value
    value.set_zero();
    reader.read(t, value);
  });
  reader.close();  // unmap before the next ranks' turn
  if (checkpoint_load_hook) checkpoint_load_hook("read_end", rank);
}
#endif

/// tp rank 0 reads one rank's shard of one tensor at a time, straight from the files, and sends it: it never
/// holds a whole tensor, only its own shard and the one block in flight. A block it cannot read goes out as
/// zeros, so no rank waits for one that will not come; the error is agreed on once the tensor is sent, and
/// raised on every rank.
template <class TpMesh>
void read_on_rank0_and_send(model_tensors const& model, TpMesh const& tp, checkpoint_reader& reader,
                            checkpoint_index const& index, std::filesystem::path const& dir, std::string_view who) {
  int const size = tp.size(), rank = tp.rank();
  if (rank == 0 && checkpoint_load_hook) checkpoint_load_hook("read_begin", rank);
  model.for_each(size, rank, true, [&](tensor_layout const& t, tensor_values const& value) {
    if (!index.find(t.name)) return;  // missing (non-strict): skipped alike on every rank
    std::string error;
    if (rank != 0) {
      auto bytes = bytes_of(value);
      shardwise::recv(tp, bytes, 0);
    }
    std::vector<std::byte> storage(rank == 0 && size > 1 ? value.bytes() : 0);  // the block in flight
    for (int r = size - 1; r >= 0 && rank == 0; --r) {  // rank 0's own block last, straight into its storage
      tensor_values const block = r == 0 ? value : tensor_values{storage.data(), value.type, value.rows, value.cols};
      block.set_zero();
      if (error.empty()) {
        try {
          tensor_layout theirs = t;
          theirs.row_offset = t.shard_dim == 0 ? t.local_rows * static_cast<std::size_t>(r) : 0;
          theirs.col_offset = t.shard_dim == 1 ? t.local_cols * static_cast<std::size_t>(r) : 0;
          reader.read(theirs, block);
        } catch (std::exception const& e) {
          error = e.what();
        }
      }
      if (r != 0) shardwise::send(tp, bytes_of(block), r);
    }
    agree_on_errors(tp, error, "reading a tensor on tp rank 0", dir, who);
  });
  if (rank == 0 && checkpoint_load_hook) checkpoint_load_hook("read_end", rank);
}

template <class Model, class TpMesh>
void fsdp_load_axes<Model, TpMesh>::relay(checkpoint_reader& reader, checkpoint_index const& index,
                                          std::filesystem::path const& dir, std::string_view who) const {
  relay_shards(
      model, tp, dir, who,
      [&](tensor_layout const& theirs, auto& block, std::string& error) {
        std::vector<typename std::remove_cvref_t<decltype(block)>::Scalar> box;
        try {
          reader.read(theirs, block.data(), box);
        } catch (std::exception const& e) {
          error = e.what();
        }
      },
      [&](std::string const& name) { return index.find(name) != nullptr; });
  reader.close();
}

/// In turns of ranks_per_step ranks; an error is carried to the end so that no rank waits forever.
template <class Axes, class TpMesh>
void read_in_turns(Axes const& axes, model_tensors const& tensors, TpMesh const& tp, checkpoint_reader& reader,
                   load_state const& s, std::filesystem::path const& dir) {
  int const size = turn_size(tp, s.options), rank = turn_rank(tp, s.options), per_step = s.options.ranks_per_step;
  std::string error;
  for (int turn = 0; turn * per_step < size; ++turn) {
    if (rank / per_step == turn && error.empty()) {
      try {
        read_shard(tensors, tp.size(), tp.rank(), reader, s.outcome.index);
      } catch (std::exception const& e) {
        error = e.what();
      }
    }
    if (s.options.turns)
      s.options.turns->barrier();
    else if constexpr (requires { tp.comm(0); })
      tp.comm(0).barrier();
  }
  axes.agree(error, "reading the rank's shard", dir, s.who);
}

/// The loader behind load_sharded, load_consolidated and load_pretrained: locate(source, index, label,
/// unexpected) finds the checkpoint (the folder its pieces' files are relative to, the index, the file to name
/// in errors, and the file's tensors it leaves unread); then the model and the index are compared and each rank
/// reads the boxes its shard needs.
template <class Axes, class TpMesh>
load_outcome load_tensors_into(model_tensors const& tensors, Axes const& axes, TpMesh const& tp,
                               std::filesystem::path const& dir, load_options const& options, std::string_view who,
                               checkpoint_locator const& locate) {
  int const size = tp.size(), rank = tp.rank();
  load_mode const mode = load_mode_of(axes, tp, options);
  load_state s{{}, {}, who, options, {}};
  check_agreed(axes, mode, options, dir, who, [&] { check_against_model(tensors, size, rank, s, locate); });
  checkpoint_reader reader(s.source, s.outcome.index, who, options.verify_checksums);
  if (mode == load_mode::node_reads) {
    std::string const error = read_for_the_node(tensors, size, rank, reader, s.outcome.index, *options.turns);
    axes.agree(error, "reading on the node's first rank", dir, who);
    return std::move(s.outcome);
  }
  if constexpr (Axes::fully_sharded) {
    if (mode == load_mode::rank0_relays) {
      axes.relay(reader, s.outcome.index, dir, who);
      return std::move(s.outcome);
    }
  }
  if constexpr (requires { tp.comm(0); }) {
    if (mode == load_mode::rank0_sends) {
      read_on_rank0_and_send(tensors, tp, reader, s.outcome.index, dir, who);
      return std::move(s.outcome);
    }
  }
  if (mode == load_mode::in_turns) {
    read_in_turns(axes, tensors, tp, reader, s, dir);
    return std::move(s.outcome);
  }
  read_shard(tensors, size, rank, reader, s.outcome.index);
  return std::move(s.outcome);
}

/// load_tensors_into the model's table: the loader's body depends on the model's type only through its axes (FSDP's,
/// or tp's alone), so that it is compiled once per tp mesh for every model that is not fully sharded.
template <class Model, class TpMesh>
load_outcome load_into(Model& model, TpMesh const& tp, std::filesystem::path const& dir, load_options const& options,
                       std::string_view who, checkpoint_locator const& locate) {
  return load_tensors_into(tensors_of(model), load_axes_of(model, tp), tp, dir, options, who, locate);
}

/// Runs `load_once` (one attempt at a load) until the ranks of the axes `agreeing` have loaded one and the same
/// save, as load_sharded_agreed says; the loop does not depend on the model's type.
template <class... Agreeing>
checkpoint_index retry_load(std::function<checkpoint_index()> const& load_once, std::filesystem::path const& dir,
                            load_options const& options, Agreeing const&... agreeing) {
  read_turns const* const world = options.turns && options.turns->max_over_world ? options.turns.get() : nullptr;
  constexpr int attempts = 50;
  for (int attempt = 1;; ++attempt) {
    std::uint64_t const before = detail::current_generation(detail::normalized_dir(dir));
    load_attempt a;
    try {
      a.index = load_once();
    } catch (detail::checkpoint_changed const& e) {
      a.status = 1, a.error = e.what();
    } catch (std::exception const& e) {
      // A file a save removed while this rank read it looks like a damaged checkpoint: look again.
      a.status = detail::current_generation(detail::normalized_dir(dir)) != before ? 1 : 2;
      a.error = e.what();
    }
    bool const last = attempt == attempts;
    std::string const replaced = last ? replaced_every_time(dir, attempts) : std::string();
    load_verdict const verdict = agreed_verdict(a, last, agreeing...);
    if (!world) {
      if (verdict == load_verdict::done) return a.index;
      if (verdict == load_verdict::failed) raise_failed_load(a, replaced, dir, agreeing...);
      continue;
    }
    std::string failure;  // the group's words, for the world's verdict
    if (verdict == load_verdict::failed) {
      try {
        raise_failed_load(a, replaced, dir, agreeing...);
      } catch (std::exception const& e) {
        failure = e.what();
      }
    }
    if (world_verdict(*world, verdict, a, last, failure, replaced) == load_verdict::done) return a.index;
  }
}
/// load_sharded with the layouts of tp (a mesh, or single_stage) and its outcome agreed over `agreeing` (every
/// axis whose ranks load together: tp, and FSDP's dp) and, with turns from sw::node_turns, over their world: the
/// ranks read again together, or fail together with one error, and none waits for a peer that went on.
template <class Model, class TpMesh, class... Agreeing>
checkpoint_index load_sharded_agreed(Model& model, TpMesh const& tp, std::filesystem::path const& dir,
                                     load_options const& options, Agreeing const&... agreeing) {
  namespace fs = std::filesystem;
  checkpoint_locator const locate = [&](fs::path& source, checkpoint_index& index, std::string& label,
                                        std::vector<std::string>&) {
    source = detail::normalized_dir(dir);
    fs::path const previous = previous_checkpoint_dir(source);
    if (!fs::exists(source / checkpoint_index_name) && fs::exists(previous / checkpoint_index_name))
      source = previous;  // a save on a file system without RENAME_EXCHANGE died between its two renames
    index = read_checkpoint_index(source);
    label = (source / checkpoint_index_name).string();
  };
  return retry_load([&] { return detail::load_into(model, tp, dir, options, "load_sharded", locate).index; }, dir,
                    options, agreeing...);
}
}  // namespace detail

/// Loads a sharded checkpoint into the model, whatever tp size saved it: each rank reads only the boxes its
/// shard needs, and checks them against the checksums of the save (load_options::verify_checksums). A save
/// that replaces the folder meanwhile is noticed (every rank file carries its save's generation) and the load
/// starts again, so every rank ends with the data of one and the same save. Returns the checkpoint's index
/// (step, metadata).
template <class Model, class TpMesh>
checkpoint_index load_sharded(Model& model, TpMesh const& tp, std::filesystem::path const& dir,
                              load_options const& options = {}) {
  return detail::load_sharded_agreed(model, tp, dir, options, tp);
}

/// Fills a lazily declared, parallelized model: each rank allocates and reads only its shard. Returns the
/// model, now usable.
template <module Model, class TpMesh>
Model& load_sharded(Lazy<Model>& lazy, TpMesh const& tp, std::filesystem::path const& dir,
                    load_options const& options = {}) {
  (void)load_sharded(lazy.unmaterialized(), tp, dir, options);
  return lazy.unmaterialized();
}

}  // namespace shardwise
