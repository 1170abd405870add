#pragma once
// When fully_shard's units gather, release and reduce: the decisions its hooks make around every module call and
// at the ends of each pass, apart from what gathering and reducing are. The sharded model (fsdp/fully_shard.hpp)
// acts with collectives; a model run on shapes (fsdp/step_cost.hpp) records their transfers. One schedule for
// both, so that FSDP's cost is the order its step runs in.
#include <algorithm>
#include <cstddef>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/core/module_hooks.hpp"
#include "shardwise/fsdp/policy.hpp"
#include "shardwise/plan/tree.hpp"

namespace shardwise::detail {

/// A unit: the parameters gathered together, and the module whose sw::forward gathers them (null: the root).
struct fsdp_unit {
  module_id module;  // none: the root
  std::string path;
  std::vector<std::size_t> slots;
  bool gathered = false, prefetching = false;  // prefetching: its gathers started, to be finished where used
  bool called = false, reduced = false;        // in the current step
  int forwards = 0, backwards = 0;             // in the current pipeline step
  bool unreduced = false;                      // gradients accumulated whole, not yet reduced (no gradient sync)
};

/// The unit of the module `module` at `path`, nothing gathered.
inline fsdp_unit unit_at(module_id module, std::string path) {
  fsdp_unit u;
  u.module = module, u.path = std::move(path);
  return u;
}

/// Sets `units` to the root, then the modules of `model` the wrap policy Wrap makes units, in walk order; for
/// wrap_min_params, the modules go to `candidates` instead (assign_fsdp_units picks among them by size).
template <class Wrap, class Model>
void find_fsdp_units(Model& model, std::vector<fsdp_unit>& units, std::vector<fsdp_unit>& candidates) {
  units.assign(1, fsdp_unit{});
  auto on_module = [&](auto& m, std::string const& path) {
    using M = std::remove_cvref_t<decltype(m)>;
    if (path.empty()) return;  // the model itself: the root unit
    if constexpr (std::is_same_v<Wrap, wrap_min_params>)
      candidates.push_back(unit_at(id_of(m), path));
    else if constexpr (wraps<Wrap, M>::value)
      units.push_back(unit_at(id_of(m), path));
  };
  auto on_layer = skip_node;
  walk_tree(model, std::string(), on_module, on_layer);
}

/// Gives each parameter (named `names[s]`, `sizes[s]` elements as FSDP counts it) to the unit whose module lies
/// above it (static policies make it unique; the root when none does); for wrap_min_params, children first,
/// a candidate whose parameters no unit holds yet reach `min_num_params` becomes a unit and takes them.
inline void assign_fsdp_units(std::vector<fsdp_unit>& units, std::vector<fsdp_unit> const& candidates,
                              std::vector<std::string> const& names, std::vector<std::size_t> const& sizes,
                              std::size_t min_num_params) {
  std::vector<std::size_t> owner(names.size(), 0);
  for (std::size_t s = 0; s < names.size(); ++s)
    for (std::size_t u = 1; u < units.size(); ++u)
      if (path_within(units[u].path, names[s])) owner[s] = u;
  for (auto c = candidates.rbegin(); c != candidates.rend(); ++c) {  // pre-order reversed: children first
    std::size_t count = 0;
    for (std::size_t s = 0; s < names.size(); ++s)
      if (owner[s] == 0 && path_within(c->path, names[s])) count += sizes[s];
    if (count == 0 || count < min_num_params) continue;
    units.push_back(unit_at(c->module, c->path));
    for (std::size_t s = 0; s < names.size(); ++s)
      if (owner[s] == 0 && path_within(c->path, names[s])) owner[s] = units.size() - 1;
  }
  for (std::size_t s = 0; s < names.size(); ++s) units[owner[s]].slots.push_back(s);
}

/// The moments of a step at which the sharded model manages the whole matrices it keeps for reuse
/// (fsdp_spare_matrices); a run on shapes has none to manage.
enum class fsdp_moment {
  forward_starting,             ///< Before a forward releases what the last pass left gathered.
  forward_units_released,       ///< Then: nothing gathered yet in this forward.
  unit_started,                 ///< A unit's module has gathered (and prefetched) what it needs.
  last_forward_unit_released,   ///< The last unit of a forward released its parameters.
  last_backward_unit_finished,  ///< The last unit of a backward (before the root's) reduced and released.
  backward_starting,            ///< Before a backward.
  pass_ended,                   ///< After a forward or a backward.
  pipeline_starting             ///< Before a pipeline step, whose passes interleave.
};

/// What happens to a unit's parameters and gradients; fsdp_schedule decides when.
class fsdp_unit_actions {
 public:
  fsdp_unit_actions() = default;
  fsdp_unit_actions(fsdp_unit_actions const&) = delete;
  fsdp_unit_actions& operator=(fsdp_unit_actions const&) = delete;
  /// Gathers the unit's parameters whole (this tp rank's tensors), now.
  virtual void gather(fsdp_unit& u) = 0;
  /// Starts gathering them (a prefetch); finish_gather completes it.
  virtual void start_gather(fsdp_unit& u) = 0;
  /// Completes the gathers start_gather began.
  virtual void finish_gather(fsdp_unit& u) = 0;
  /// Frees the gathered parameters (where the strategy keeps a shard of its own).
  virtual void release(fsdp_unit& u) = 0;
  /// The tp step of a unit's gradients (sw::finish_gradients' for its parameters), while it is gathered.
  virtual void finish_gradients(fsdp_unit& u) = 0;
  /// The dp step: finished gradients averaged into the gradient shards (reduce-scattered, or all-reduced), freed.
  virtual void reduce_finished_gradients(fsdp_unit& u) = 0;
  /// The unit's backward is about to accumulate gradients.
  virtual void reuse_gradients(fsdp_unit&) {}
  /// A moment of the step (see fsdp_moment).
  virtual void at(fsdp_moment) {}

 protected:
  ~fsdp_unit_actions() = default;
};

/// What decides a schedule besides the units: the strategy's effects and the options.
struct fsdp_schedule_rules {
  bool frees_after_forward = true;  ///< full_shard: a unit's parameters are released after its forward.
  bool keeps_master = true;         ///< The shard is a copy of its own: a release frees the gathered tensors.
  bool forward_prefetch = false;    ///< fsdp_options::forward_prefetch.
  bool backward_prefetch = false;   ///< fsdp_options::backward_prefetch.
};

/// The hooks sw::forward and sw::backward call around every module of a fully sharded model, and the ends of its
/// passes and of a pipeline step over it: which unit gathers, prefetches, releases and reduces when. Unit 0 is
/// the root (the parameters no other unit holds), gathered for the whole forward and reduced last.
class fsdp_schedule final : public module_hooks {
 public:
  fsdp_schedule(fsdp_unit_actions& act, fsdp_schedule_rules rules) : act_(act), rules_(rules) {}

  std::vector<fsdp_unit> units;  ///< The units, the root first.
  bool sync = true;              ///< set_requires_gradient_sync: a backward reduces the gradients.

  /// Idle again when a pass ends, also when it throws: the hooks act within the model's passes only.
  class pass {
   public:
    explicit pass(fsdp_schedule& s) : s_(s) {}
    ~pass() { s_.phase_ = phase::idle; }
    pass(pass const&) = delete;
    pass& operator=(pass const&) = delete;

   private:
    fsdp_schedule& s_;
  };

  /// A forward begins: whatever a pass left gathered released, the root gathered (and the next unit prefetched).
  void begin_forward();
  /// The forward ended: prefetches finished, and every unit must have run (else throws, naming it).
  void end_forward();
  /// A backward begins.
  void begin_backward();
  /// The backward ended: the root's gradients reduced, every unit that ran forward checked.
  void end_backward();

  /// A pipeline step begins: the root gathered for the whole step, every other unit released and its counts reset;
  /// `every_microbatch`: a unit's gradients are reduced after each of its backwards, else at the end.
  void begin_pipeline_step(bool every_microbatch);
  /// Before a pipeline forward action: the hooks act as in a forward.
  void pipeline_forward() { phase_ = phase::forward; }
  /// Before a pipeline backward action: the hooks act as in a backward (a recomputed forward gathers, no more).
  void pipeline_backward() { phase_ = phase::backward; }
  /// After a pipeline step's last action: what was left unreduced and the root's reduced, the root released;
  /// throws, naming the unit, if a unit's forwards and backwards differ.
  void end_pipeline_step();
  /// The hooks stop acting (a pipeline step threw).
  void abandon() {
    phase_ = phase::idle;
    pipelining_ = false;
  }

  /// Gathers the unit now (finishing its prefetch, if one is in flight).
  void gather(fsdp_unit& u);
  /// Frees the unit's gathered parameters (its prefetch finished first).
  void release(fsdp_unit& u);
  /// Finishes every prefetch still in flight.
  void finish_prefetches() {
    for (auto& u : units)
      if (u.prefetching) finish_prefetch(u);
  }
  /// How many units' gathers started ahead of their use.
  [[nodiscard]] std::size_t prefetched() const { return prefetched_; }
  /// The index of a unit in `units`.
  [[nodiscard]] std::size_t index_of(fsdp_unit const& u) const { return static_cast<std::size_t>(&u - units.data()); }

  void before_forward(module_id module) override;
  void after_forward(module_id module) override;
  void before_backward(module_id module) override;
  void after_backward(module_id module) override;

 private:
  enum class phase { idle, forward, backward };

  fsdp_unit* unit_of(module_id module) {
    for (std::size_t i = 1; i < units.size(); ++i)
      if (units[i].module == module) return &units[i];
    return nullptr;
  }
  void prefetch(std::optional<std::size_t> i);
  void finish_prefetch(fsdp_unit& u) {
    act_.finish_gather(u);
    u.prefetching = false;
    u.gathered = true;
  }
  void reduce(fsdp_unit& u) {
    act_.finish_gradients(u);
    act_.reduce_finished_gradients(u);
    u.unreduced = false;
  }
  void finish_root();
  [[nodiscard]] std::optional<std::size_t> next_in_forward(std::size_t i) const;
  [[nodiscard]] std::optional<std::size_t> next_in_backward(std::size_t i) const;

  fsdp_unit_actions& act_;
  fsdp_schedule_rules rules_;
  phase phase_ = phase::idle;
  std::vector<std::size_t> forward_order_, last_forward_order_;  // units in the order their forwards ran
  std::size_t prefetched_ = 0;
  bool pipelining_ = false;  // within a pipeline step
  bool reduce_every_microbatch_ = true;
};

inline void fsdp_schedule::gather(fsdp_unit& u) {
  if (u.prefetching) finish_prefetch(u);
  if (u.gathered) return;
  act_.gather(u);
  u.gathered = true;
}

inline void fsdp_schedule::release(fsdp_unit& u) {
  if (u.prefetching) finish_prefetch(u);  // MPI may still be writing into the memory
  act_.release(u);
  if (rules_.keeps_master) u.gathered = false;
}

/// Starts gathering unit `i` (none: past the ends), to be finished where it is used.
inline void fsdp_schedule::prefetch(std::optional<std::size_t> i) {
  if (!i) return;
  fsdp_unit& u = units[*i];
  if (u.gathered || u.prefetching || u.reduced) return;
  act_.start_gather(u);
  u.prefetching = true;
  ++prefetched_;
}

/// The unit that ran after unit `i` (0: the root, which runs first) in the last forward, or in model order.
inline std::optional<std::size_t> fsdp_schedule::next_in_forward(std::size_t i) const {
  if (last_forward_order_.empty()) return i + 1 < units.size() ? std::optional(i + 1) : std::nullopt;
  if (i == 0) return last_forward_order_.front();
  auto at = std::find(last_forward_order_.begin(), last_forward_order_.end(), i);
  if (at == last_forward_order_.end() || ++at == last_forward_order_.end()) return std::nullopt;
  return *at;
}

/// The unit whose backward follows unit `i`'s: the one that ran before it in this step's forward.
inline std::optional<std::size_t> fsdp_schedule::next_in_backward(std::size_t i) const {
  auto const at = std::find(forward_order_.begin(), forward_order_.end(), i);
  if (at == forward_order_.end() || at == forward_order_.begin()) return std::nullopt;
  return *(at - 1);
}

inline void fsdp_schedule::begin_forward() {
  phase_ = phase::forward;
  pipelining_ = false;
  act_.at(fsdp_moment::forward_starting);
  for (auto& u : units) {
    release(u);  // whatever a forward without backward left gathered predates the optimizer's last step
    u.called = u.reduced = false;
  }
  act_.at(fsdp_moment::forward_units_released);
  if (!forward_order_.empty()) last_forward_order_ = std::move(forward_order_);
  forward_order_.clear();
  gather(units[0]);
  if (rules_.forward_prefetch) prefetch(next_in_forward(0));
}

inline void fsdp_schedule::end_forward() {
  act_.at(fsdp_moment::pass_ended);
  phase_ = phase::idle;
  finish_prefetches();  // nothing may still read the shards when the optimizer steps them
  for (std::size_t i = 1; i < units.size(); ++i)
    if (!units[i].called)
      fail("shardwise::fully_shard: the unit \"", units[i].path,
           "\" was not called through sw::forward in the model's forward, so its parameters were never gathered; "
           "call it as sw::forward(module, x) (and sw::backward(module, dy) in backward)");
}

inline void fsdp_schedule::begin_backward() {
  phase_ = phase::backward;
  act_.at(fsdp_moment::backward_starting);
}

inline void fsdp_schedule::finish_root() {
  if (sync)
    reduce(units[0]);
  else
    units[0].unreduced = true;
  release(units[0]);
}

inline void fsdp_schedule::end_backward() {
  finish_prefetches();
  finish_root();  // its parameters' storage kept for the next forward's first gather
  act_.at(fsdp_moment::pass_ended);
  phase_ = phase::idle;
  for (std::size_t i = 1; i < units.size(); ++i)
    if (units[i].called && !units[i].reduced)
      fail("shardwise::fully_shard: the unit \"", units[i].path,
           "\" ran forward but its gradients were not reduced: call it as sw::backward(module, dy) in the model's "
           "backward");
}

inline void fsdp_schedule::before_forward(module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module)) {
    gather(*u);
    u->called = true;
    if (phase_ != phase::forward) return;  // a recomputation in backward (activation checkpointing)
    if (pipelining_) {  // a schedule interleaves microbatches' passes: no prefetch, no storage handed along
      ++u->forwards;
      return;
    }
    forward_order_.push_back(index_of(*u));
    if (rules_.forward_prefetch) prefetch(next_in_forward(index_of(*u)));
    act_.at(fsdp_moment::unit_started);
  }
}

inline void fsdp_schedule::after_forward(module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module); u && phase_ == phase::forward && rules_.frees_after_forward) {
    release(*u);
    if (!next_in_forward(index_of(*u))) act_.at(fsdp_moment::last_forward_unit_released);
  }
}

inline void fsdp_schedule::before_backward(module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module)) {
    gather(*u);
    act_.reuse_gradients(*u);
    if (pipelining_) return;
    if (rules_.backward_prefetch) prefetch(next_in_backward(index_of(*u)));
    act_.at(fsdp_moment::unit_started);
  }
}

inline void fsdp_schedule::after_backward(module_id module) {
  if (phase_ == phase::idle) return;  // a module called outside this model's passes
  if (auto* u = unit_of(module)) {
    if (sync && (!pipelining_ || reduce_every_microbatch_)) {
      reduce(*u);
    } else {
      if (pipelining_) act_.finish_gradients(*u);  // finished while gathered; the step's end reduces them
      u->unreduced = true;
    }
    release(*u);
    if (pipelining_) {
      ++u->backwards;
      return;
    }
    if (!next_in_backward(index_of(*u))) act_.at(fsdp_moment::last_backward_unit_finished);
    u->reduced = true;
  }
}

inline void fsdp_schedule::begin_pipeline_step(bool every_microbatch) {
  act_.at(fsdp_moment::pipeline_starting);
  finish_prefetches();
  for (auto& u : units) {
    release(u);
    u.called = u.reduced = false;
    u.forwards = u.backwards = 0;
  }
  pipelining_ = true;
  reduce_every_microbatch_ = every_microbatch;
  phase_ = phase::forward;
  gather(units[0]);
}

inline void fsdp_schedule::end_pipeline_step() {
  abandon();
  for (std::size_t i = 1; i < units.size(); ++i)
    if (units[i].unreduced && sync) {  // finished after each backward
      act_.reduce_finished_gradients(units[i]);
      units[i].unreduced = false;
    }
  finish_root();
  for (std::size_t i = 1; i < units.size(); ++i)
    if (units[i].forwards != units[i].backwards || units[i].forwards == 0)
      fail("shardwise::run_pipeline_step: the unit \"", units[i].path, "\" of the fully sharded stage ran ",
           units[i].forwards, " forwards and ", units[i].backwards,
           " backwards in the step; call it as sw::forward(module, x) in the stage's forward and "
           "sw::backward(module, dy) in its backward, once each per microbatch");
}

}  // namespace shardwise::detail
