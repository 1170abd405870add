#pragma once
// What runs around a module call besides its plan entry: sw::forward and sw::backward tell the hooks the module's
// layers carry (an FSDP unit's gather before the module runs, its free and gradient reduce-scatter after) which
// module they are about to call and have called. The hooks are state of the model's layers, set by the object
// that owns them (fully_shard's sharded model), not of the thread: no layer carries any by default. On shapes the
// run's trace carries them instead (FSDP's schedule, when its cost is derived: fsdp/step_cost.hpp).
#include <utility>

namespace shardwise::detail {

/// One address per module type: with the module's address it names a module (a module and its first member
/// share an address).
template <class Module>
inline constexpr char module_type_tag = 0;

/// A module as the hooks see it: its address and its type's tag.
struct module_id {
  void const* address = nullptr;
  void const* type = nullptr;
  friend bool operator==(module_id const&, module_id const&) = default;
};

template <class Module>
module_id id_of(Module const& module) {
  return {&module, &module_type_tag<Module>};
}

/// Called around every sw::forward / sw::backward of a module, with the module's id.
struct module_hooks {
  module_hooks() = default;
  module_hooks(module_hooks const&) = delete;
  module_hooks& operator=(module_hooks const&) = delete;
  virtual void before_forward(module_id module) = 0;
  virtual void after_forward(module_id module) = 0;
  virtual void before_backward(module_id module) = 0;
  virtual void after_backward(module_id module) = 0;

 protected:
  ~module_hooks() = default;
};

/// A pointer a layer carries for the object that set it (fully_shard's hooks, a pipeline's weight-gradient
/// work): a copied layer belongs to neither, so a copy starts without it, and assignment keeps the target's.
template <class P>
class attached {
 public:
  attached() = default;
  attached(attached const&) noexcept {}
  attached& operator=(attached const&) noexcept { return *this; }
  ~attached() = default;
  [[nodiscard]] P* get() const { return to_; }
  void set(P* to) { to_ = to; }

 private:
  P* to_ = nullptr;
};

/// The hooks a layer carries for the modules above it (set by fully_shard on every layer of the model it shards).
using attached_hooks = attached<module_hooks>;

}  // namespace shardwise::detail
