#pragma once
// Ranks as threads of one process. Collectives read peers' buffers directly through shared memory, so a
// byte moves once. An exception on any rank reaches every rank blocked in a collective and is rethrown by
// run_threads; a rank that returns while peers wait for it is reported by name instead of hanging, and one stuck
// in the program's own code after a failure is left running while the error reaches run_threads' caller.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/compiled_once.hpp"
#include "shardwise/mesh/thread/group.hpp"
#include "shardwise/mesh/thread/shared_memory_collectives.hpp"
#include "shardwise/mesh/timeout.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise {

class ThreadComm;
namespace detail {
SHARDWISE_DETAIL_RUNTIME_ENTRY desync_test_holds& desync_test_holds_of(ThreadComm const& comm);
}

/// One rank's handle on a group of threads: the world of run_threads, or a mesh axis split from it.
class ThreadComm {
 public:
  /// The collective algorithms: ranks share memory, so they copy straight from each other's buffers.
  using collectives = detail::shared_memory_collectives;

  /// Rank `rank` of `group` (made by run_threads and split; not for users to build).
  ThreadComm(std::shared_ptr<detail::thread_group> group, int rank) : group_(std::move(group)), rank_(rank) {}

  [[nodiscard]] int rank() const { return rank_; }                        ///< This rank in the group.
  [[nodiscard]] int size() const { return group_->size(); }               ///< The number of ranks in the group.
  [[nodiscard]] std::string_view label() const { return group_->label; }  ///< The group's name, for errors.

  /// The number of this rank's next collective call on the group (0, 1, 2, ...), which its peers must match.
  [[nodiscard]] std::uint64_t next_call_number() const {
    // Only this rank's thread writes its counter (peers read it for timeout messages): a plain increment, no
    // locked read-modify-write on every call.
    auto& calls = group_->own[static_cast<std::size_t>(rank_)].calls;
    std::uint64_t const number = calls.load(std::memory_order_relaxed);
    calls.store(number + 1, std::memory_order_relaxed);
    return number;
  }

  /// How long a rank waits in a collective of this group (and of groups split from it afterwards) before it
  /// raises, naming the ranks that did not arrive. Call it on every rank.
  void set_timeout(timeout_duration limit) const { group_->timeout.store(limit.count()); }
  /// The current limit: SHARDWISE_TIMEOUT seconds, 30 minutes by default, or what set_timeout gave.
  [[nodiscard]] timeout_duration timeout() const { return group_->wait_limit(); }

  /// Waits until every rank of the group has reached it; `what` names the call in errors.
  void barrier(char const* what = "barrier") const { group_->barrier(rank_, what); }

  /// Publishes this rank's slot, waits for every rank's, calls fn(slots), then waits until every rank is
  /// done reading, so no buffer is reused while a peer still reads it. Collective.
  template <class Fn>
  void exchange(detail::thread_slot mine, char const* what, Fn&& fn) const {
    group_->slots[static_cast<std::size_t>(rank_)] = std::move(mine);
    group_->barrier(rank_, what, true, group_->slots[static_cast<std::size_t>(rank_)].call);
    std::exception_ptr failure;
    try {
      fn(static_cast<std::vector<detail::thread_slot> const&>(group_->slots));
    } catch (detail::peer_failure const&) {
      throw;  // peers are gone; waiting for them would throw again
    } catch (...) {
      failure = std::current_exception();
    }
    group_->barrier(rank_, what, /*may_leave=*/false);  // peers may still read this rank's buffers
    if (failure) std::rethrow_exception(failure);
  }

  /// Ranks with the same color form a new communicator, ordered by key then rank. Collective.
  [[nodiscard]] ThreadComm split(int color, int key, std::string_view label) const;

  /// Buffered send of raw bytes with the tensor shape they came from.
  void send_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const;

  /// recv_bytes, copying the message to where(shape, byte_count) points (the MPI backend receives it there).
  template <class Where>
  void recv_into(int source, int tag, Where&& where) const {
    recv_bytes(source, tag, [&](extents const& shape, std::vector<unsigned char> const& bytes) {
      void* const destination = where(shape, bytes.size());
      if (!bytes.empty()) std::memcpy(destination, bytes.data(), bytes.size());
    });
  }

  /// Blocks until a message from `source` with `tag` arrives, then hands it to take(shape, bytes).
  template <class Take>
  void recv_bytes(int source, int tag, Take&& take) const {
    check_peer(source, "recv");
    auto const deadline = std::chrono::steady_clock::now() + timeout();
    std::unique_lock lock(group_->mail_mutex);
    auto const key = std::tuple{source, rank_, tag};
    while (true) {
      auto found = group_->mailbox.find(key);
      if (found != group_->mailbox.end() && !found->second.empty()) {
        auto message = std::move(found->second.front());
        found->second.pop_front();
        lock.unlock();
        take(message.shape, message.bytes);
        return;
      }
      if (group_->run->aborted.load(std::memory_order_acquire)) throw detail::peer_failure();
      if (group_->run->finished[static_cast<std::size_t>(group_->members[static_cast<std::size_t>(source)])].load())
        detail::fail("shardwise::recv on mesh axis \"", label(), "\": rank ", source,
                     " returned from its function without sending the message rank ", rank_, " waits for (tag ", tag,
                     ")");
      if (group_->mail_ready.wait_until(lock, deadline) == std::cv_status::timeout &&
          std::chrono::steady_clock::now() >= deadline)
        detail::recv_timed_out(rank_, label(), timeout(), source, tag);
    }
  }

 private:
  void check_peer(int peer, char const* what) const;

  friend detail::desync_test_holds& detail::desync_test_holds_of(ThreadComm const& comm);

  std::shared_ptr<detail::thread_group> group_;
  int rank_;
};

#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY ThreadComm ThreadComm::split(int color, int key, std::string_view label) const {
  // A call like any collective (as on MPI): a rank that meets another call here is told so, by name.
  detail::call_record const call = detail::make_call<char>(*this, detail::collective_kind::split, {},
                                                           storage_order::row_major, call_site{nullptr, 0});
  detail::thread_slot mine;
  mine.key = detail::call_key::of(call), mine.call = &call, mine.a = color, mine.b = key;
  std::vector<std::pair<std::int64_t, int>> order;  // (key, old rank) of the ranks with my color
  exchange(std::move(mine), "split", [&](std::vector<detail::thread_slot> const& slots) {
    if (!std::all_of(slots.begin(), slots.end(), [&](auto const& s) { return s.key == slots.front().key; }))
      detail::shared_memory_collectives::report_disagreement(slots, group_->label);
    for (int q = 0; q < size(); ++q) {
      auto const& slot = slots[static_cast<std::size_t>(q)];
      if (slot.a == color) order.emplace_back(slot.b, q);
    }
  });  // and everyone has read color and key
  std::sort(order.begin(), order.end());
  int new_rank = 0;
  while (order[static_cast<std::size_t>(new_rank)].second != rank_) ++new_rank;
  int const leader = order.front().second;
  if (leader == rank_) {
    std::vector<int> world_ranks;
    for (auto const& [k, q] : order) world_ranks.push_back(group_->members[static_cast<std::size_t>(q)]);
    auto group = std::make_shared<detail::thread_group>(group_->run, std::move(world_ranks), std::string(label),
                                                        group_->wait_limit());
    group_->run->register_group(group);
    group_->slots[static_cast<std::size_t>(rank_)].group = std::move(group);
  }
  group_->barrier(rank_, "split");
  auto group = group_->slots[static_cast<std::size_t>(leader)].group;
  group_->barrier(rank_, "split");  // everyone holds its group; the slots may be reused
  if (leader == rank_) group_->slots[static_cast<std::size_t>(rank_)].group.reset();
  return ThreadComm(std::move(group), new_rank);
}

SHARDWISE_DETAIL_RUNTIME_ENTRY void ThreadComm::send_bytes(void const* data, std::size_t bytes, extents const& shape,
                                                           int destination, int tag) const {
  check_peer(destination, "send");
  detail::thread_group::message message{shape, std::vector<unsigned char>(bytes)};
  if (bytes) std::memcpy(message.bytes.data(), data, bytes);
  {
    std::lock_guard lock(group_->mail_mutex);
    group_->mailbox[{rank_, destination, tag}].push_back(std::move(message));
  }
  group_->mail_ready.notify_all();
}

SHARDWISE_DETAIL_RUNTIME_ENTRY void ThreadComm::check_peer(int peer, char const* what) const {
  if (peer < 0 || peer >= size() || peer == rank_)
    detail::fail("shardwise::", what, " on mesh axis \"", label(), "\": peer rank ", peer,
                 " is not another rank of this axis (size ", size(), ", this rank ", rank_, ")");
}
#endif

/// Tests only: the desync test holds (mesh/desync.hpp) of the rank `comm` is on, kept in its run's state.
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY detail::desync_test_holds& detail::desync_test_holds_of(ThreadComm const& comm) {
  auto const world_rank = static_cast<std::size_t>(comm.group_->members[static_cast<std::size_t>(comm.rank_)]);
  return comm.group_->run->test_holds[world_rank];
}
#endif

namespace detail {

/// How long the ranks of run_threads have to return once one has failed, before they are given up as stuck.
inline constexpr std::chrono::seconds stuck_rank_grace{10};

/// What the rank threads of one run_threads call share with it: the first error, and which ranks still run.
/// On the heap, not on run_threads' stack: a rank given up as stuck is left running, and may return later.
class thread_run_outcome : public std::enable_shared_from_this<thread_run_outcome> {
 public:
  explicit thread_run_outcome(int ranks) : running_(static_cast<std::size_t>(ranks), true) {}
  thread_run_outcome(thread_run_outcome const&) = delete;
  thread_run_outcome& operator=(thread_run_outcome const&) = delete;
  ~thread_run_outcome() {
    if (watch_.joinable()) watch_.detach();  // the watch itself held the last reference
  }

  /// Rank `rank` failed with the exception being handled. The first error is kept, but an original error
  /// replaces a peer_failure, which only stands in for it. The first failure starts the grace.
  void failed() {
    std::string const real = current_message();
    std::lock_guard const hold(mutex_);
    if (!error_ || (!real.empty() && !error_is_real_)) {
      error_ = std::current_exception();
      error_is_real_ = !real.empty();
      message_ = real.empty() ? "another rank failed" : real;
    }
    if (failed_) return;
    failed_ = true;
    failed_at_ = std::chrono::steady_clock::now();
    if (running_[0]) watch_calling_thread();
  }

  /// Once rank 0 has returned: waits for the watch of the calling thread to end, so that what it releases (the
  /// last reference to this outcome, and with it the error) is released before run_threads goes on, not
  /// alongside the caller's handling of the error.
  void end_watch() {
    std::thread watch;
    {
      std::lock_guard const hold(mutex_);
      watch = std::move(watch_);
    }
    if (watch.joinable()) watch.join();
  }

  /// Rank `rank` returned (or threw).
  void returned(int rank) {
    {
      std::lock_guard const hold(mutex_);
      running_[static_cast<std::size_t>(rank)] = false;
    }
    changed_.notify_all();
  }

  /// Waits until every rank has returned, or until stuck_rank_grace after the first failure (without one, a
  /// rank that never returns is waited for, as by join); returns the ranks still running then.
  std::vector<int> await_ranks() {
    std::unique_lock lock(mutex_);
    auto const all_back = [&] { return std::find(running_.begin(), running_.end(), true) == running_.end(); };
    changed_.wait(lock, [&] { return all_back() || failed_; });
    if (!all_back()) changed_.wait_until(lock, failed_at_ + stuck_rank_grace, all_back);
    return still_running();
  }

  /// The error to rethrow (null: no rank failed), and its message; locked, as a rank given up may still fail.
  [[nodiscard]] std::exception_ptr error() const {
    std::lock_guard const hold(mutex_);
    return error_;
  }
  [[nodiscard]] std::string message() const {
    std::lock_guard const hold(mutex_);
    return message_;
  }

 private:
  /// The message of the exception being handled; empty for a peer_failure.
  static std::string current_message() {
    try {
      throw;
    } catch (peer_failure const&) {
      return {};
    } catch (std::exception const& e) {
      return e.what()[0] == '\0' ? std::string("an exception without a message") : std::string(e.what());
    } catch (...) {
      return "an exception that is not a std::exception";
    }
  }

  [[nodiscard]] std::vector<int> still_running() const {
    std::vector<int> ranks;
    for (std::size_t r = 0; r < running_.size(); ++r)
      if (running_[r]) ranks.push_back(static_cast<int>(r));
    return ranks;
  }

  /// Rank 0 runs on the calling thread: if it is stuck in the program's own code, nothing can return to
  /// run_threads' caller, so a watch ends the process after the grace, with the failure's message and exit
  /// code 1, as MPI's abort does (a rank 0 that never returns would keep the process alive forever).
  void watch_calling_thread() {
    try {
      watch_ = std::thread([self = shared_from_this()] {
        std::unique_lock lock(self->mutex_);
        if (self->changed_.wait_until(lock, self->failed_at_ + stuck_rank_grace, [&] { return !self->running_[0]; }))
          return;
        std::fprintf(stderr,
                     "shardwise::run_threads: %zu rank(s) did not return within %lld s after a rank failed; they "
                     "are stuck outside any collective (in the program's own code), where no error reaches them, "
                     "and rank 0 is among them: it runs on the calling thread, so no exception can reach "
                     "run_threads' caller, and the process ends with exit code 1. The failure: %s\n",
                     self->still_running().size(), static_cast<long long>(stuck_rank_grace.count()),
                     self->message_.c_str());
        std::fflush(stderr);
        std::_Exit(1);
      });
    } catch (...) {  // no thread to be had: rank 0 is waited for, as before
    }
  }

  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<bool> running_;
  std::exception_ptr error_;
  bool error_is_real_ = false;
  std::string message_;
  bool failed_ = false;
  std::chrono::steady_clock::time_point failed_at_{};
  std::thread watch_;  ///< The watch of the calling thread (watch_calling_thread), joined by end_watch.
};

/// Throws the error of a run whose `stuck` ranks did not return within the grace after `outcome`'s failure:
/// a shardwise::error naming them, with the original exception nested (std::rethrow_if_nested finds it).
[[noreturn]] SHARDWISE_DETAIL_RUNTIME_ENTRY void throw_stuck_ranks(std::vector<int> const& stuck,
                                                                   thread_run_outcome const& outcome);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
[[noreturn]] SHARDWISE_DETAIL_RUNTIME_ENTRY void throw_stuck_ranks(std::vector<int> const& stuck,
                                                                   thread_run_outcome const& outcome) {
  bool const one = stuck.size() == 1;
  std::string const text =
      concat("shardwise::run_threads: ", stuck.size(), " rank(s) did not return within ", stuck_rank_grace.count(),
             " s after a rank failed: world ", ranks_text(stuck), one ? " is" : " are",
             " stuck outside any collective (in the program's own code), where no error reaches ", one ? "it" : "them",
             "; ", one ? "it is" : "they are",
             " left running (detached), and the failure is thrown here. End the program soon: a rank that resumes runs "
             "on with objects that may be gone. The failure: ",
             outcome.message());
  try {
    std::rethrow_exception(outcome.error());
  } catch (...) {
    std::throw_with_nested(error(text));
  }
}
#endif

}  // namespace detail

namespace detail {
/// The function each rank runs, without its type, so that run_threads' work is compiled once
/// (mesh/compiled_once.hpp).
struct rank_function {
  void* function;
  void (*call)(void* function, ThreadComm& world);
};

/// run_threads' work, for a rank_function.
SHARDWISE_DETAIL_RUNTIME_ENTRY void run_rank_threads(int ranks, rank_function fn);
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY void run_rank_threads(int ranks, rank_function fn) {
  if (ranks < 1) detail::fail("shardwise::run_threads: needs at least 1 rank, got ", ranks);
  auto run = std::make_shared<detail::thread_run_state>(ranks);
  std::vector<int> everyone(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) everyone[static_cast<std::size_t>(r)] = r;
  auto world = std::make_shared<detail::thread_group>(run, std::move(everyone), "world", detail::default_timeout());
  run->register_group(world);
  auto outcome = std::make_shared<detail::thread_run_outcome>(ranks);

  // Everything by value but fn: a rank left running after the grace must not reach this frame once it is gone.
  auto rank_main = [world, run, outcome, &fn](int rank) {
    try {
      ThreadComm comm(world, rank);
      fn.call(fn.function, comm);
      run->finished[static_cast<std::size_t>(rank)].store(true, std::memory_order_release);
    } catch (...) {
      outcome->failed();
      run->aborted.store(true, std::memory_order_release);
    }
    run->wake_all();
    outcome->returned(rank);
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks - 1));
  for (int r = 1; r < ranks; ++r) threads.emplace_back(rank_main, r);
  rank_main(0);
  outcome->end_watch();
  // A thread stuck in the program's own code cannot be joined, and nothing can stop it safely; detaching it
  // lets the error reach the caller, and a process may exit with it still running (exit ends every thread).
  std::vector<int> const stuck = outcome->await_ranks();
  for (int r = 1; r < ranks; ++r) {
    auto& thread = threads[static_cast<std::size_t>(r - 1)];
    if (std::find(stuck.begin(), stuck.end(), r) != stuck.end())
      thread.detach();
    else
      thread.join();
  }
  if (!stuck.empty()) detail::throw_stuck_ranks(stuck, *outcome);
  if (outcome->error()) std::rethrow_exception(outcome->error());
}
#endif
}  // namespace detail

/// Runs fn(ThreadComm& world) on `ranks` threads (rank 0 on the calling thread) and returns when all are
/// done. If any rank throws, every rank blocked in a collective is released and the first exception is
/// rethrown here. A rank that does not return within 10 s of a failure (stuck in its own code, where no error
/// reaches it) is left running, detached, and a shardwise::error naming it is thrown here instead, with the
/// failure's message (and the failure nested), so that main can catch it, report and return; if that rank is
/// rank 0 (the calling thread), nothing can return here, and the process ends with the message and exit code 1.
template <class Fn>
void run_threads(int ranks, Fn&& fn) {
  using function_type = std::remove_reference_t<Fn>;
  auto* const function = const_cast<void*>(static_cast<void const*>(std::addressof(fn)));
  detail::run_rank_threads(ranks,
                           {function, [](void* f, ThreadComm& world) { (*static_cast<function_type*>(f))(world); }});
}

}  // namespace shardwise
