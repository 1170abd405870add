#pragma once
// The time limit of a collective's data phase on MPI. Every rank has agreed on the call before data moves, so
// the blocking MPI call that moves it can only stall if a peer stops or the network fails mid-transfer; MPI
// cannot interrupt it, and its non-blocking twins measured up to 2.7x slower here (bench_mpi_nonblocking). So a
// watchdog thread, started on the first data phase, ends the job with a message if one lasts longer than the
// communicator's timeout, and prints the wait notices of mesh/wait_notice.hpp before that; arming and disarming
// it costs two clock reads and a few atomic stores per call.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string_view>
#include <thread>

#include "shardwise/mesh/mpi/failure.hpp"
#include "shardwise/mesh/timeout.hpp"
#include "shardwise/mesh/wait_notice.hpp"

namespace shardwise::detail {

/// The data phase this process is in, if any, watched by one thread per process.
class mpi_data_watchdog {
 public:
  /// The process's watchdog.
  static mpi_data_watchdog& instance() {
    static mpi_data_watchdog watchdog;
    return watchdog;
  }

  /// What is guarded: the strings must outlive the call (the watchdog reads them only when it fires).
  struct phase {
    char const* what;     ///< "all_reduce", "send", ...
    char const* stalled;  ///< What a stall means, for the message.
    std::string_view axis;
    int rank;
    timeout_duration limit;
    wait_notice_times notice{};  ///< When a long data phase is reported (by default never).
  };

  /// Runs `move_data` (blocking MPI calls), ending the job if it lasts longer than `current.limit`.
  template <class MoveData>
  void guard(phase const& current, MoveData&& move_data) {
    std::call_once(started_, [this] { std::thread([this] { watch(); }).detach(); });
    what_.store(current.what, std::memory_order_relaxed);
    stalled_.store(current.stalled, std::memory_order_relaxed);
    axis_.store(current.axis.data(), std::memory_order_relaxed);
    axis_length_.store(current.axis.size(), std::memory_order_relaxed);
    rank_.store(current.rank, std::memory_order_relaxed);
    limit_ms_.store(current.limit.count(), std::memory_order_relaxed);
    notice_first_ms_.store(current.notice.first.count(), std::memory_order_relaxed);
    notice_every_ms_.store(current.notice.every.count(), std::memory_order_relaxed);
    since_ms_.store(now_ms(), std::memory_order_release);
    struct disarm {
      std::atomic<std::int64_t>& since;
      ~disarm() { since.store(0, std::memory_order_release); }
    } const when_done{since_ms_};
    move_data();
  }

  /// Whether a data phase is running now (tests use it to stop a rank inside one).
  [[nodiscard]] bool armed() const { return since_ms_.load(std::memory_order_acquire) != 0; }

 private:
  static std::int64_t now_ms() {
    auto const since_epoch = std::chrono::steady_clock::now().time_since_epoch();
    return std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch).count() + 1;  // never 0
  }

  [[noreturn]] void watch() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::int64_t const since = since_ms_.load(std::memory_order_acquire);
      if (since == 0) continue;
      if (std::int64_t const elapsed = now_ms() - since; elapsed <= limit_ms_.load(std::memory_order_relaxed)) {
        notice(since, elapsed);
        continue;
      }
      std::string_view const axis(axis_.load(std::memory_order_relaxed), axis_length_.load(std::memory_order_relaxed));
      std::fprintf(stderr,
                   "shardwise: rank %d of mesh axis \"%.*s\": %s did not finish within the timeout (%s): %s. "
                   "Ending the job (MPI_Abort); raise the limit with SHARDWISE_TIMEOUT (seconds) or set_timeout "
                   "if the transfer is just slow\n",
                   rank_.load(), static_cast<int>(axis.size()), axis.data(), what_.load(),
                   seconds_text(timeout_duration(limit_ms_.load())).c_str(), stalled_.load());
      std::fflush(stderr);
      mpi_abort_job();
    }
  }

  /// Prints the next notice of the data phase that began at `since` once it is due (on the watchdog's thread).
  void notice(std::int64_t since, std::int64_t elapsed) {
    if (since != noticed_since_) noticed_since_ = since, notices_ = 0;
    std::int64_t const first = notice_first_ms_.load(std::memory_order_relaxed);
    std::int64_t const every = notice_every_ms_.load(std::memory_order_relaxed);
    if (first <= 0 || elapsed < first + notices_ * every) return;
    std::string_view const axis(axis_.load(std::memory_order_relaxed), axis_length_.load(std::memory_order_relaxed));
    std::fprintf(stderr,
                 "shardwise: still waiting: rank %d of mesh axis \"%.*s\" has waited %s in %s, which blocks in MPI "
                 "(if it never finishes: %s). A slow transfer cannot be told from a stuck one, so the wait goes on "
                 "until the timeout (%s, SHARDWISE_TIMEOUT), which ends the job; this notice repeats every %s "
                 "(SHARDWISE_WAIT_NOTICE=seconds sets the first, 0 turns them off)\n",
                 rank_.load(), static_cast<int>(axis.size()), axis.data(),
                 seconds_text(timeout_duration(first + notices_ * every)).c_str(), what_.load(), stalled_.load(),
                 seconds_text(timeout_duration(limit_ms_.load())).c_str(),
                 seconds_text(timeout_duration(every)).c_str());
    std::fflush(stderr);
    ++notices_;
  }

  std::once_flag started_;
  std::atomic<std::int64_t> since_ms_{0};  // when the current data phase began; 0: none
  std::atomic<std::int64_t> limit_ms_{0};
  std::atomic<char const*> what_{""};
  std::atomic<char const*> stalled_{""};
  std::atomic<char const*> axis_{""};
  std::atomic<std::size_t> axis_length_{0};
  std::atomic<int> rank_{-1};
  std::atomic<std::int64_t> notice_first_ms_{0};
  std::atomic<std::int64_t> notice_every_ms_{0};
  std::int64_t noticed_since_ = 0;  // the data phase the notices count for, and how many it has had
  std::int64_t notices_ = 0;
};

}  // namespace shardwise::detail
