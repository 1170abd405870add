#pragma once
// A collective that has started and not finished: what sw::all_gather_start returns. Its result is in place
// once wait() returns; until then the caller keeps the input and output alive and untouched.
#include <functional>
#include <utility>

#include "shardwise/mesh/call.hpp"

namespace shardwise {

/// A started collective (sw::all_gather_start). wait() finishes it: on MPI it completes the non-blocking
/// transfer under the mesh's timeout; on the thread mesh the data was copied at the start already (the copy is
/// the rank's own work, so there is nothing to overlap it with). Destroying one that was not waited for waits.
class pending_collective {
 public:
  pending_collective() = default;  ///< Nothing pending.
  /// A collective that `finish` completes.
  explicit pending_collective(std::function<void()> finish) : finish_(std::move(finish)) {}
  /// Takes over `other`'s collective (other is then empty).
  pending_collective(pending_collective&& other) noexcept : finish_(std::exchange(other.finish_, nullptr)) {}
  /// Waits for this collective, then takes over `other`'s.
  pending_collective& operator=(pending_collective&& other) noexcept {
    if (this != &other) {
      finish_quietly();
      finish_ = std::exchange(other.finish_, nullptr);
    }
    return *this;
  }
  pending_collective(pending_collective const&) = delete;
  pending_collective& operator=(pending_collective const&) = delete;
  ~pending_collective() { finish_quietly(); }

  /// Completes the collective (raising as a blocking call would: timeout, a failed peer).
  void wait() {
    if (!finish_) return;
    auto finish = std::exchange(finish_, nullptr);
    finish();
  }
  /// Whether wait() still has work to do.
  [[nodiscard]] bool pending() const { return static_cast<bool>(finish_); }

 private:
  // A destructor cannot raise: a failure here is the one the peers see (their wait raises, or the job ends).
  void finish_quietly() noexcept {
    try {
      wait();
    } catch (...) {
    }
  }

  std::function<void()> finish_;
};

namespace detail {

/// Starts an all-gather with the backend's collectives C: their own started transfer where they have one, else
/// their blocking gather, finished before this returns.
template <class C, class Comm, class E, class Output>
pending_collective start_all_gather(Comm const& comm, E const* data, call_record const& call, storage_order order,
                                    Output&& output, collective_site const& site) {
  if constexpr (requires { C::transfers_in_background; }) {
    return C::all_gather_start(comm, data, call, order, std::forward<Output>(output), site);
  } else {
    C::all_gather(comm, data, call, order, std::forward<Output>(output), site);
    return {};
  }
}

}  // namespace detail

}  // namespace shardwise
