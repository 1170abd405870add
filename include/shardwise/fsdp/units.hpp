#pragma once
// fully_shard's bookkeeping: a slot per parameter (its shard and what the sharded model does to the layer's
// tensors), a unit per group of parameters gathered together, and the whole matrices a full-shard step
// releases and reuses. Internal to sw::fully_shard.
#include <Eigen/Core>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/fold_hash.hpp"
#include "shardwise/core/module_hooks.hpp"
#include "shardwise/fsdp/schedule.hpp"
#include "shardwise/mesh/collectives.hpp"
#include "shardwise/mesh/pending.hpp"
#include "shardwise/nn/kernels/functional_types.hpp"

namespace shardwise {
class expert_parallel;
}  // namespace shardwise

namespace shardwise::detail {

/// One parameter under FSDP: its tensor on this tp rank (rows x cols), this dp rank's rows of it, and what the
/// sharded model does to the layer's tensors, typed where it was made.
template <class T>
struct fsdp_slot {
  std::string name;
  Eigen::Index rows = 0, cols = 0, first_row = 0, row_count = 0;
  std::vector<T> shard, shard_grad;            // no_shard: shard unused (the layer's tensor is the shard)
  T norm_weight = 1;                           // 0: another tp rank or copy counts it in the global norm
  bool mirror = false;                         // a pipeline stage's copy of a weight another stage owns
  bool frozen = false;                         // sw::freeze: gathered for compute; no gradient, never stepped
  expert_parallel const* placed = nullptr;     // an expert placed over ep: cut over its replicas, not over dp
  std::function<T*(bool whole)> resize_value;  // whole: rows x cols (its data); else freed (null)
  std::function<void()> finish;                // the tp step of sw::finish_gradients, for this parameter
  std::function<void()> mark_finished;
  std::function<T*()> finished_grad;          // the finished gradient's data
  std::function<void(bool free)> clear_grad;  // the layer's gradients freed (or zeroed, for no_shard)
  std::function<void()> reuse_grad;           // a kept matrix, zeroed, as the layer's gradient to accumulate into
};

/// What the ranks of an FSDP mesh must agree on before any shard moves: the model they shard (its parameters'
/// names and shapes) and its units, folded into a hash, beside counts to name in the error.
struct fsdp_structure {
  std::uint64_t hash = 0x9e3779b97f4a7c15ull;
  std::uint64_t parameters = 0, elements = 0, units = 0;
  char strategy[16] = {};  // the sharding strategy's name: a rank of another one would move other collectives

  /// Folds v into the hash.
  void mix(std::uint64_t v) { hash = fold_hash(hash, v); }
  /// Folds a name in, byte by byte.
  void mix(std::string_view text) { hash = fold_hash(hash, text); }
  [[nodiscard]] bool same(fsdp_structure const& o) const {
    return hash == o.hash && parameters == o.parameters && elements == o.elements && units == o.units;
  }
};

/// Every rank of `comm` must shard the same model into the same units by the same strategy (a model of another
/// size, or another wrap policy, would fail later with a shape error of other numbers on each rank; another
/// strategy, with collectives that do not match): agreed before any shard moves.
template <class Comm, class Slot>
void agree_on_fsdp_structure(Comm const& comm, std::vector<Slot> const& slots, std::vector<fsdp_unit> const& units,
                             std::string_view strategy) {
  fsdp_structure mine;
  strategy.copy(mine.strategy, sizeof mine.strategy - 1);
  for (auto const& s : slots) {
    mine.mix(s.placed ? std::string_view("placed expert") : std::string_view(s.name));  // ep ranks: other experts
    mine.mix(static_cast<std::uint64_t>(s.rows)), mine.mix(static_cast<std::uint64_t>(s.cols));
    ++mine.parameters, mine.elements += static_cast<std::uint64_t>(s.rows * s.cols);
  }
  for (auto const& u : units) {
    mine.mix(u.path), mine.mix(u.slots.size());
    for (std::size_t s : u.slots) mine.mix(s);
    ++mine.units;
  }
  auto const all = gather_values(comm, mine);
  auto const named = [&](std::size_t q) { return std::string_view(all[q].strategy); };
  if (std::any_of(all.begin(), all.end(), [&](auto const& o) { return named(0) != o.strategy; })) {
    std::string ranks;
    for (std::size_t q = 0; q < all.size(); ++q) ranks += concat(q ? "; " : "", "rank ", q, " has ", named(q));
    fail("shardwise::fully_shard: the ranks of mesh axis \"", comm.label(), "\" shard by different strategies: ", ranks,
         ". Give every rank the same fsdp_policy strategy (full_shard, shard_grad_op or no_shard)");
  }
  if (std::all_of(all.begin(), all.end(), [&](auto const& o) { return o.same(all.front()); })) return;
  std::string ranks;
  for (std::size_t q = 0; q < all.size(); ++q)
    ranks += concat(q ? "; " : "", "rank ", q, " has ", all[q].parameters, " parameters (", all[q].elements,
                    " elements) in ", all[q].units, " units (structure hash ", all[q].hash, ")");
  fail("shardwise::fully_shard: the ranks of mesh axis \"", comm.label(), "\" shard different models: ", ranks,
       ". Build the same model (the same configuration) with the same wrap policy on every rank");
}

/// Whole matrices full_shard released (gathered parameters, full gradients), kept for the next gather or gradient
/// of the same shape: glibc gives tensors this large back to the kernel at once, and faulting each unit's pages in
/// again at every gather and gradient cost a full-shard step 7-20% here (docs/benchmarks.md). Within a pass, kept
/// from a unit's release to the next unit's start, which takes what fits (its gather, its gradients, its prefetch)
/// and frees the rest. Between passes only gathered parameters stay, for the next pass's first gather: after a
/// forward, its last unit's (the backward begins with it); after a backward, the root's, released after its
/// reduce-scatter (the next forward gathers it first), which every step holds at its peak anyway. The blocks'
/// storage is freed before the root's reduce-scatter, where it would add to the peak; gradients at each pass's end.
template <class T>
struct fsdp_spare_matrices {
  struct kept {
    nn::matrix<T> storage;
    bool parameter = false;  // a gathered parameter's (else a gradient's)
  };
  bool active = false;
  std::vector<kept> spare;
  std::size_t reused_bytes = 0;  // taken since the last forward began

  /// Frees `m` to 0 x 0, its storage kept while active.
  void keep(nn::matrix<T>& m, bool parameter) {
    if (active && m.size() > 0) spare.push_back({std::move(m), parameter});
    m.resize(0, 0);
  }
  /// `m` (empty) takes a kept matrix of rows x cols, old values in it; false where there is none.
  bool take(nn::matrix<T>& m, Eigen::Index rows, Eigen::Index cols) {
    auto const fits = [&](kept const& k) { return k.storage.rows() == rows && k.storage.cols() == cols; };
    auto const at = std::find_if(spare.begin(), spare.end(), fits);
    if (at == spare.end()) return false;
    m.swap(at->storage);
    spare.erase(at);
    reused_bytes += static_cast<std::size_t>(rows * cols) * sizeof(T);
    return true;
  }
  /// A pass ended: its gradients' storage is freed, the parameters' kept for the next pass.
  void end_pass() {
    std::erase_if(spare, [](kept const& k) { return !k.parameter; });
  }
  /// Everything freed, nothing kept until active again.
  void stop() {
    active = false;
    spare = {};
  }
  /// Bytes kept now.
  [[nodiscard]] std::size_t bytes() const {
    std::size_t n = 0;
    for (auto const& k : spare) n += static_cast<std::size_t>(k.storage.size()) * sizeof(T);
    return n;
  }
};

}  // namespace shardwise::detail
