#pragma once
// Ranks as threads of one process. Collectives read peers' buffers directly through shared memory, so a
// byte moves once. An exception on any rank reaches every rank blocked in a collective and is rethrown by
// run_threads; a rank that returns while peers wait for it is reported by name instead of hanging.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
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
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/shared_memory_collectives.hpp"
#include "shardwise/mesh/timeout.hpp"
#include "shardwise/tensor/extents.hpp"

namespace shardwise {

namespace detail {

/// Thrown on ranks that were blocked when another rank failed; run_threads reports the original error.
class peer_failure : public error {
 public:
  peer_failure() : error("shardwise::run_threads: another rank failed; its exception is rethrown") {}
};

/// Shared by every group of one run_threads call.
struct thread_run_state {
  explicit thread_run_state(int n) : world_size(n), finished(new std::atomic<bool>[static_cast<std::size_t>(n)]) {
    for (int i = 0; i < n; ++i) finished[static_cast<std::size_t>(i)] = false;
    for (int i = 0; i < n; ++i) waiting_in[static_cast<std::size_t>(i)] = nullptr;
  }
  int world_size;
  std::atomic<bool> aborted{false};
  std::unique_ptr<std::atomic<bool>[]> finished;
  // Per world rank: the group it waits in (nullptr when it waits nowhere) and the call, for timeout messages.
  std::unique_ptr<std::atomic<thread_group const*>[]> waiting_in{new std::atomic<thread_group const*>[world_size]};
  std::unique_ptr<std::atomic<char const*>[]> waiting_for{new std::atomic<char const*>[world_size]};
  std::mutex registry_mutex;
  std::vector<std::weak_ptr<thread_group>> groups;

  void register_group(std::shared_ptr<thread_group> const& group) {
    std::lock_guard lock(registry_mutex);
    groups.push_back(group);
  }
  void wake_all();
};

struct thread_group {
  thread_group(std::shared_ptr<thread_run_state> run_state, std::vector<int> world_ranks, std::string axis_label,
               timeout_duration wait_limit)
      : run(std::move(run_state)),
        members(std::move(world_ranks)),
        label(std::move(axis_label)),
        slots(members.size()),
        own(new rank_state[members.size()]),
        timeout(wait_limit.count()) {
    for (std::size_t q = 0; q < members.size(); ++q) own[q].calls = 0, own[q].arrival = 0;
  }

  std::shared_ptr<thread_run_state> run;
  std::vector<int> members;  // world rank of each group rank
  std::string label;         // mesh axis name, for error messages
  std::vector<thread_slot> slots;
  // What each group rank writes for itself, on a cache line of its own (a shared line would bounce between the
  // cores on every call): the collective calls it made so far, and 1 + the barrier generation it last arrived
  // at, which a waiting rank reads to name who is missing.
  struct alignas(64) rank_state {
    std::atomic<std::uint64_t> calls;
    std::atomic<std::uint32_t> arrival;
  };
  std::unique_ptr<rank_state[]> own;
  std::atomic<timeout_duration::rep> timeout;
  // One word, so that arriving, completing and withdrawing are single atomic steps: bits 0-31 the barrier
  // generation, 32-47 the ranks arrived at it, 48-63 wake-ups for failure checks (which must not look like a
  // completed barrier).
  static constexpr std::uint64_t one_arrival = std::uint64_t{1} << 32, one_wakeup = std::uint64_t{1} << 48;
  std::atomic<std::uint64_t> word{0};
  // Ranks past their spin sleep here, with a deadline; whoever completes a barrier wakes them.
  std::atomic<int> sleepers{0};
  std::mutex sleep_mutex;
  std::condition_variable sleep_ready;

  // Point-to-point messages, buffered: (source, destination, tag) -> queue of messages.
  struct message {
    extents shape;
    std::vector<unsigned char> bytes;
  };
  std::mutex mail_mutex;
  std::condition_variable mail_ready;
  std::map<std::tuple<int, int, int>, std::deque<message>> mailbox;

  [[nodiscard]] int size() const { return static_cast<int>(members.size()); }
  [[nodiscard]] timeout_duration wait_limit() const { return timeout_duration(timeout.load()); }

  void wake_sleepers() {
    if (sleepers.load() == 0) return;  // seq_cst, paired with the sleeper's increment: no wake-up is lost
    {
      std::lock_guard lock(sleep_mutex);
    }
    sleep_ready.notify_all();
  }

  void signal() {
    word.fetch_add(one_wakeup, std::memory_order_acq_rel);
    wake_sleepers();
    {
      std::lock_guard lock(mail_mutex);
    }
    mail_ready.notify_all();
  }

  [[nodiscard]] bool peers_cannot_arrive() const {
    if (run->aborted.load(std::memory_order_acquire)) return true;
    for (int member : members)
      if (run->finished[static_cast<std::size_t>(member)].load(std::memory_order_acquire)) return true;
    return false;
  }

  /// Throws if this wait can never finish: a rank failed, or a member returned from its function.
  void check_peers(int rank, char const* what) const {
    if (run->aborted.load(std::memory_order_acquire)) throw peer_failure();
    for (std::size_t q = 0; q < members.size(); ++q) {
      if (run->finished[static_cast<std::size_t>(members[q])].load(std::memory_order_acquire)) {
        fail("shardwise::ThreadMesh: rank ", q, " of mesh axis \"", label, "\" returned from its function while rank ",
             rank, " waits for it in ", what, "; every rank must call the same collectives in the same order");
      }
    }
  }

  /// What rank q of this group is doing, for a timeout message: where it waits, or what it last called.
  [[nodiscard]] std::string whereabouts(std::size_t q) const {
    auto const world_rank = static_cast<std::size_t>(members[q]);
    thread_group const* elsewhere = run->waiting_in[world_rank].load();
    char const* what = run->waiting_for[world_rank].load();
    if (elsewhere != nullptr && elsewhere != this)
      return concat("rank ", q, " is waiting in ", what, " on mesh axis \"", elsewhere->label,
                    "\" (the ranks make calls on different axes in different orders: a crossing)");
    std::uint64_t const made = own[q].calls.load();
    if (made == 0) return concat("rank ", q, " has made no collective call on this axis yet");
    return concat("rank ", q, " is not in a collective of this axis; it has made ", made, " calls on it");
  }

  [[noreturn]] void time_out(int rank, char const* what, std::uint32_t generation) const {
    std::string missing;
    for (std::size_t q = 0; q < members.size(); ++q)
      if (own[q].arrival.load() != generation + 1) missing += (missing.empty() ? "" : "; ") + whereabouts(q);
    collective_timed_out(rank, label, wait_limit(), what, missing);
  }

  /// Waits for every member. A rank may give up waiting (timeout, failed peer) only where `may_leave`: at the
  /// start of a collective, before any peer reads its buffers; it then withdraws its arrival, so no barrier
  /// ever completes with a rank that left.
  void barrier(int rank, char const* what, bool may_leave = true) {
    if (members.size() == 1) return;
    std::uint64_t const before = word.fetch_add(one_arrival);
    auto const generation = static_cast<std::uint32_t>(before);
    own[static_cast<std::size_t>(rank)].arrival.store(generation + 1, std::memory_order_relaxed);
    if (((before / one_arrival) & 0xffff) == static_cast<std::uint64_t>(size() - 1)) {
      // The last one: the next generation (wrapping within its 32 bits), no ranks arrived. seq_cst: see
      // wake_sleepers.
      std::uint64_t const next = generation == 0xffffffffu ? std::uint64_t(0) - 0xffffffffu : 1;
      word.fetch_add(next - static_cast<std::uint64_t>(size()) * one_arrival);
      wake_sleepers();
      return;
    }
    auto passed = [&] { return static_cast<std::uint32_t>(word.load(std::memory_order_acquire)) != generation; };
    for (int spin = 0; spin < 320; ++spin) {  // the common case: peers arrive within a microsecond
      if (passed()) return;
      if (spin >= 256) std::this_thread::yield();
    }
    sleep_until_passed(rank, what, generation, may_leave);
  }

 private:
  /// Takes back this rank's arrival at `generation`; false if the barrier completed first (the rank stays).
  bool withdraw(std::uint32_t generation) {
    std::uint64_t w = word.load();
    while (static_cast<std::uint32_t>(w) == generation)
      if (word.compare_exchange_weak(w, w - one_arrival)) return true;
    return false;
  }

  /// More ranks than cores, or a slow peer: sleep until the barrier passes, a peer fails, or the time is up.
  void sleep_until_passed(int rank, char const* what, std::uint32_t generation, bool may_leave) {
    auto passed = [&] { return static_cast<std::uint32_t>(word.load(std::memory_order_acquire)) != generation; };
    auto const world_rank = static_cast<std::size_t>(members[static_cast<std::size_t>(rank)]);
    run->waiting_for[world_rank].store(what);
    run->waiting_in[world_rank].store(this);
    auto const deadline = std::chrono::steady_clock::now() + wait_limit();
    sleepers.fetch_add(1);
    struct leave {
      thread_group& group;
      std::size_t world_rank;
      ~leave() {
        group.sleepers.fetch_sub(1);
        group.run->waiting_in[world_rank].store(nullptr);
      }
    } const on_exit{*this, world_rank};
    std::unique_lock lock(sleep_mutex);
    while (!passed()) {
      if (may_leave && peers_cannot_arrive()) {
        lock.unlock();
        if (!withdraw(generation)) return;  // a member may have passed this very barrier and then returned
        check_peers(rank, what);            // throws: a peer failed or returned
        fail("shardwise::ThreadMesh: a peer of rank ", rank, " in ", what, " cannot arrive");
      }
      if (may_leave && std::chrono::steady_clock::now() >= deadline) {
        lock.unlock();
        if (!withdraw(generation)) return;
        time_out(rank, what, generation);
      }
      if (may_leave)
        sleep_ready.wait_until(lock, deadline);
      else
        sleep_ready.wait(lock);
    }
  }
};

inline void thread_run_state::wake_all() {
  std::vector<std::shared_ptr<thread_group>> live;
  {
    std::lock_guard lock(registry_mutex);
    for (auto const& weak : groups)
      if (auto group = weak.lock()) live.push_back(std::move(group));
  }
  for (auto const& group : live) group->signal();
}

}  // namespace detail

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
    group_->barrier(rank_, what);
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
  [[nodiscard]] ThreadComm split(int color, int key, std::string_view label) const {
    detail::thread_slot mine;
    mine.a = color;
    mine.b = key;
    group_->slots[static_cast<std::size_t>(rank_)] = mine;
    group_->barrier(rank_, "split");
    std::vector<std::pair<std::int64_t, int>> order;  // (key, old rank) of the ranks with my color
    for (int q = 0; q < size(); ++q) {
      auto const& slot = group_->slots[static_cast<std::size_t>(q)];
      if (slot.a == color) order.emplace_back(slot.b, q);
    }
    std::sort(order.begin(), order.end());
    int new_rank = 0;
    while (order[static_cast<std::size_t>(new_rank)].second != rank_) ++new_rank;
    int const leader = order.front().second;
    group_->barrier(rank_, "split");  // everyone has read color and key
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

  /// Buffered send of raw bytes with the tensor shape they came from.
  void send_bytes(void const* data, std::size_t bytes, extents const& shape, int destination, int tag) const {
    check_peer(destination, "send");
    detail::thread_group::message message{shape, std::vector<unsigned char>(bytes)};
    if (bytes) std::memcpy(message.bytes.data(), data, bytes);
    {
      std::lock_guard lock(group_->mail_mutex);
      group_->mailbox[{rank_, destination, tag}].push_back(std::move(message));
    }
    group_->mail_ready.notify_all();
  }

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
  void check_peer(int peer, char const* what) const {
    if (peer < 0 || peer >= size() || peer == rank_)
      detail::fail("shardwise::", what, " on mesh axis \"", label(), "\": peer rank ", peer,
                   " is not another rank of this axis (size ", size(), ", this rank ", rank_, ")");
  }

  std::shared_ptr<detail::thread_group> group_;
  int rank_;
};

/// Runs fn(ThreadComm& world) on `ranks` threads (rank 0 on the calling thread) and returns when all are
/// done. If any rank throws, every rank blocked in a collective is released and the first exception is
/// rethrown here.
template <class Fn>
void run_threads(int ranks, Fn&& fn) {
  if (ranks < 1) detail::fail("shardwise::run_threads: needs at least 1 rank, got ", ranks);
  auto run = std::make_shared<detail::thread_run_state>(ranks);
  std::vector<int> everyone(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) everyone[static_cast<std::size_t>(r)] = r;
  auto world = std::make_shared<detail::thread_group>(run, std::move(everyone), "world", detail::default_timeout());
  run->register_group(world);

  std::mutex error_mutex;
  std::exception_ptr first_error;
  bool first_is_real = false;  // a peer_failure only stands in until the original error is recorded
  auto rank_main = [&](int rank) {
    try {
      ThreadComm comm(world, rank);
      fn(comm);
      run->finished[static_cast<std::size_t>(rank)].store(true, std::memory_order_release);
    } catch (...) {
      bool const real = [] {
        try {
          throw;
        } catch (detail::peer_failure const&) {
          return false;
        } catch (...) {
          return true;
        }
      }();
      {
        std::lock_guard lock(error_mutex);
        if (!first_error || (real && !first_is_real)) {
          first_error = std::current_exception();
          first_is_real = real;
        }
      }
      run->aborted.store(true, std::memory_order_release);
    }
    run->wake_all();
  };

  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(ranks - 1));
  for (int r = 1; r < ranks; ++r) threads.emplace_back(rank_main, r);
  rank_main(0);
  for (auto& t : threads) t.join();
  if (first_error) std::rethrow_exception(first_error);
}

}  // namespace shardwise
