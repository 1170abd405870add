#pragma once
// What runs around a module call besides its plan entry: sw::forward and sw::backward tell the hooks installed
// on this thread (an FSDP unit's gather before the module runs, its free and gradient reduce-scatter after) which
// module they are about to call and have called. Nothing is installed by default; a call then costs one
// thread-local read. On the thread mesh each rank is a thread, so each rank sees only its own hooks.
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

/// The hooks of this thread (null: none).
inline module_hooks*& installed_module_hooks() {
  thread_local module_hooks* hooks = nullptr;
  return hooks;
}

/// Installs hooks for its lifetime (the previous ones back after it, also when an exception leaves).
class hooks_installed {
 public:
  explicit hooks_installed(module_hooks* hooks) : previous_(std::exchange(installed_module_hooks(), hooks)) {}
  hooks_installed(hooks_installed const&) = delete;
  hooks_installed& operator=(hooks_installed const&) = delete;
  ~hooks_installed() { installed_module_hooks() = previous_; }

 private:
  module_hooks* previous_;
};

}  // namespace shardwise::detail
