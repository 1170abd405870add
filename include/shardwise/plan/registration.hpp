#pragma once
// Every shardwise layer registers its address while it lives, so parallelize can find a layer a module holds
// but forgot to list in SHARDWISE_CHILDREN — a layer that would otherwise get no shard, no optimizer step and
// no checkpoint entry, without a word. C++ cannot enumerate a class's members, so this is checked at run
// time: registered layers inside a module's object that the walk over the children did not reach.
#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string_view>
#include <utility>
#include <vector>

namespace shardwise::detail {

struct registered_layer_info {
  std::string_view kind, path;
};

class registered_layer;

/// The live layers of the process, as a list threaded through the layers' own registration members: a layer
/// registers and leaves without allocating, so its copies and moves cannot throw (and a vector of blocks moves its
/// blocks instead of copying them when it grows).
class layer_registry {
 public:
  static layer_registry& instance() {
    static layer_registry registry;
    return registry;
  }
  /// Calls fn(address, info) for every live layer registered in [begin, end), in the order of their addresses.
  template <class Fn>
  void for_each_in(void const* begin, void const* end, Fn&& fn) const;
  static std::uintptr_t address(void const* p) { return reinterpret_cast<std::uintptr_t>(p); }

 private:
  friend class registered_layer;
  mutable std::mutex mutex_;
  registered_layer* first_ = nullptr;
};

/// A member of every shardwise layer: registers the layer while it lives (copies and moves register the new
/// object; assignment keeps the address, so nothing changes).
class registered_layer {
 public:
  registered_layer(std::string_view kind, std::string_view path) noexcept : info_{kind, path} { add(); }
  registered_layer(registered_layer const& other) noexcept : info_(other.info_) { add(); }
  registered_layer& operator=(registered_layer const&) noexcept { return *this; }
  ~registered_layer() { remove(); }

 private:
  friend class layer_registry;
  void add() noexcept {
    std::lock_guard lock(registry_->mutex_);
    next_ = registry_->first_;
    if (next_) next_->previous_ = this;
    registry_->first_ = this;
  }
  void remove() noexcept {
    std::lock_guard lock(registry_->mutex_);
    (previous_ ? previous_->next_ : registry_->first_) = next_;
    if (next_) next_->previous_ = previous_;
  }
  registered_layer_info info_;
  layer_registry* registry_ = &layer_registry::instance();  // the list it joined (one per process, or per library)
  registered_layer* previous_ = nullptr;
  registered_layer* next_ = nullptr;
};

template <class Fn>
void layer_registry::for_each_in(void const* begin, void const* end, Fn&& fn) const {
  std::vector<std::pair<std::uintptr_t, registered_layer_info>> inside;
  {
    std::lock_guard lock(mutex_);
    for (registered_layer const* r = first_; r; r = r->next_)
      if (address(r) >= address(begin) && address(r) < address(end)) inside.emplace_back(address(r), r->info_);
  }
  std::sort(inside.begin(), inside.end(), [](auto const& a, auto const& b) { return a.first < b.first; });
  for (auto const& [at, info] : inside) fn(at, info);
}

}  // namespace shardwise::detail
