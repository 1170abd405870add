#pragma once
// How a layer gets its first values, handed to it by its module's constructor: a seed to draw them from, and
// whether the layer is only declared (sw::Lazy), so that it records its sizes and allocates nothing. The mode
// travels with the seed, so a module that passes its children `seed + k` passes the mode on without knowing it.
#include <cstdint>

namespace shardwise {

/// A layer's initialisation: the seed its parameters are drawn from, and whether it is only declared (built
/// inside sw::Lazy: sizes recorded, nothing allocated until sw::materialize or a load). A plain integer converts
/// to an init that draws from it; `init + k` keeps the mode, so take it as `sw::init seed` in a module's
/// constructor and hand `seed + k` to each child.
class init {
 public:
  /// Parameters drawn from `seed`, allocated when the layer is built.
  constexpr init(std::uint64_t seed = 0) noexcept : seed_(seed) {}  // NOLINT: implicit, a seed is an init

  /// The same seed, for a layer that is only declared (what sw::Lazy hands the model's constructor).
  [[nodiscard]] static constexpr init declared(std::uint64_t seed) noexcept { return init(seed, true); }

  /// The seed the parameters are drawn from.
  [[nodiscard]] constexpr std::uint64_t seed() const noexcept { return seed_; }
  /// Whether the layer only records its sizes (sw::Lazy) instead of allocating and drawing its parameters.
  [[nodiscard]] constexpr bool declares_only() const noexcept { return declared_; }

  /// Another seed, `offset` further, in the same mode.
  friend constexpr init operator+(init i, std::uint64_t offset) noexcept { return init(i.seed_ + offset, i.declared_); }
  /// Moves this seed `offset` further, keeping the mode.
  constexpr init& operator+=(std::uint64_t offset) noexcept { return seed_ += offset, *this; }
  /// The same seed in the same mode.
  friend constexpr bool operator==(init, init) = default;

 private:
  constexpr init(std::uint64_t seed, bool declared) noexcept : seed_(seed), declared_(declared) {}
  std::uint64_t seed_;
  bool declared_ = false;
};

}  // namespace shardwise
