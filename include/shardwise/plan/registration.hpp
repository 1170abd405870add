#pragma once
// Every shardwise layer registers its address while it lives, so parallelize can find a layer a module holds
// but forgot to list in SHARDWISE_CHILDREN — a layer that would otherwise get no shard, no optimizer step and
// no checkpoint entry, without a word. C++ cannot enumerate a class's members, so this is checked at run
// time: registered layers inside a module's object that the walk over the children did not reach.
#include <cstdint>
#include <map>
#include <mutex>
#include <string_view>

namespace shardwise::detail {

struct registered_layer_info {
  std::string_view kind, path;
};

class layer_registry {
 public:
  static layer_registry& instance() {
    static layer_registry registry;
    return registry;
  }
  void add(void const* at, registered_layer_info info) {
    std::lock_guard lock(mutex_);
    live_[address(at)] = info;
  }
  void remove(void const* at) {
    std::lock_guard lock(mutex_);
    live_.erase(address(at));
  }
  /// Calls fn(address, info) for every live layer registered in [begin, end).
  template <class Fn>
  void for_each_in(void const* begin, void const* end, Fn&& fn) const {
    std::lock_guard lock(mutex_);
    for (auto it = live_.lower_bound(address(begin)); it != live_.end() && it->first < address(end); ++it)
      fn(it->first, it->second);
  }
  static std::uintptr_t address(void const* p) { return reinterpret_cast<std::uintptr_t>(p); }

 private:
  mutable std::mutex mutex_;
  std::map<std::uintptr_t, registered_layer_info> live_;
};

/// A member of every shardwise layer: registers the layer while it lives (copies and moves register the new
/// object; assignment keeps the address, so nothing changes).
class registered_layer {
 public:
  registered_layer(std::string_view kind, std::string_view path) : info_{kind, path} { add(); }
  registered_layer(registered_layer const& other) : info_(other.info_) { add(); }
  registered_layer& operator=(registered_layer const&) { return *this; }
  ~registered_layer() { layer_registry::instance().remove(this); }

 private:
  void add() { layer_registry::instance().add(this, info_); }
  registered_layer_info info_;
};

}  // namespace shardwise::detail
