#pragma once
// The shared state of the thread mesh (mesh/thread/comm.hpp): one group of threads per mesh axis with its barrier
// (spin, then sleep), the run's record of which rank waits where, the desync check on it (mesh/desync.hpp),
// and failures: a rank that failed or returned releases its peers' waits.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/compiled_once.hpp"
#include "shardwise/mesh/desync.hpp"
#include "shardwise/mesh/thread/shared_memory_collectives.hpp"
#include "shardwise/mesh/timeout.hpp"
#include "shardwise/mesh/wait_notice.hpp"
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
  // When long waits are reported; read here, so that a bad SHARDWISE_WAIT_NOTICE raises before any rank runs.
  wait_notice_times notice = default_wait_notice();
  std::atomic<bool> aborted{false};
  std::unique_ptr<std::atomic<bool>[]> finished;
  // Per world rank: the group it waits in (nullptr when it waits nowhere) and the call, for timeout messages.
  std::unique_ptr<std::atomic<thread_group const*>[]> waiting_in{new std::atomic<thread_group const*>[world_size]};
  std::unique_ptr<std::atomic<char const*>[]> waiting_for{new std::atomic<char const*>[world_size]};
  std::mutex registry_mutex;
  std::vector<std::weak_ptr<thread_group>> groups;
  // The desync check (mesh/desync.hpp), guarded by desync_mutex: per world rank, the barrier it sleeps in
  // (group null: none), and the error that ends its wait once a deadlock including it is found.
  struct sleeping_wait {
    thread_group const* group = nullptr;
    std::uint32_t generation = 0;
    call_record call{};  // kind == split and sequence 0 with no record: described by `what`
    bool has_call = false;
    char const* what = "";
  };
  std::mutex desync_mutex;
  std::vector<sleeping_wait> sleeping = std::vector<sleeping_wait>(static_cast<std::size_t>(world_size));
  std::vector<std::string> verdicts = std::vector<std::string>(static_cast<std::size_t>(world_size));
  std::unique_ptr<std::atomic<bool>[]> verdict_ready{new std::atomic<bool>[static_cast<std::size_t>(world_size)] {}};
  /// Per world rank, written and read by that rank's thread only.
  std::vector<desync_test_holds> test_holds = std::vector<desync_test_holds>(static_cast<std::size_t>(world_size));

  /// Whether a deadlock including world rank r was found (read without the lock, on every wake-up).
  [[nodiscard]] bool has_verdict(std::size_t r) const { return verdict_ready[r].load(std::memory_order_acquire); }
  /// Whether world rank r, on its own thread, takes its verdict now (a test may hold it back).
  [[nodiscard]] bool verdict_to_take(std::size_t r) const {
    return has_verdict(r) && !test_held(test_holds[r].verdicts_until);
  }
  /// The error of the deadlock found for world rank r (empty: none), taken. The rank leaves its wait with it, in
  /// the same step: a check in between would take that wait for a new desync.
  std::string take_verdict(std::size_t r) {
    std::lock_guard const hold(desync_mutex);
    verdict_ready[r].store(false);
    sleeping[r] = {};
    return std::exchange(verdicts[r], {});
  }
  void check_desync(int me);

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
  void check_peers(int rank, char const* what) const;

  /// What rank q of this group is doing, for a timeout message: where it waits, or what it last called.
  [[nodiscard]] std::string whereabouts(std::size_t q) const;

  [[noreturn]] void time_out(int rank, char const* what, std::uint32_t generation) const;

  /// Waits for every member. A rank may give up waiting (timeout, failed peer) only where `may_leave`: at the
  /// start of a collective, before any peer reads its buffers; it then withdraws its arrival, so no barrier
  /// ever completes with a rank that left.
  void barrier(int rank, char const* what, bool may_leave = true, call_record const* call = nullptr);

  /// Whether world rank r sleeps in a barrier that has not passed, and if so for which world ranks. Under the
  /// run's desync_mutex. The generation is read before and after the arrivals: a barrier that passed (and
  /// perhaps filled again) meanwhile is not taken for a wait.
  static bool sleeps_unpassed(thread_run_state::sleeping_wait const& w, std::vector<int>& waits_for);

 private:
  /// Takes back this rank's arrival at `generation`; false if the barrier completed first (the rank stays).
  bool withdraw(std::uint32_t generation);

  /// More ranks than cores, or a slow peer: sleep until the barrier passes, a peer fails, a desync is found
  /// (desync_check), or the time is up.
  void sleep_until_passed(int rank, char const* what, std::uint32_t generation, bool may_leave,
                          call_record const* call);

  /// The k-th notice of a long wait in `call` (or `what`) at `generation` (mesh/wait_notice.hpp), printed by the
  /// lowest rank that waits, so that the axis gives one line.
  void print_notice(int rank, char const* what, call_record const* call, std::uint32_t generation, int k) const;

  /// Tells the desync check that this rank sleeps in this barrier's `generation`, in `call` (or `what`).
  void announce_sleep(std::size_t world_rank, char const* what, std::uint32_t generation, call_record const* call);
};

#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_group::check_peers(int rank, char const* what) const {
  if (run->aborted.load(std::memory_order_acquire)) throw peer_failure();
  for (std::size_t q = 0; q < members.size(); ++q) {
    if (run->finished[static_cast<std::size_t>(members[q])].load(std::memory_order_acquire)) {
      fail("shardwise::ThreadMesh: rank ", q, " of mesh axis \"", label, "\" returned from its function while rank ",
           rank, " waits for it in ", what, "; every rank must call the same collectives in the same order");
    }
  }
}

SHARDWISE_DETAIL_RUNTIME_ENTRY std::string thread_group::whereabouts(std::size_t q) const {
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

SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_group::time_out(int rank, char const* what, std::uint32_t generation) const {
  std::string missing;
  for (std::size_t q = 0; q < members.size(); ++q)
    if (own[q].arrival.load() != generation + 1) missing += (missing.empty() ? "" : "; ") + whereabouts(q);
  collective_timed_out(rank, label, wait_limit(), what, missing);
}

SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_group::barrier(int rank, char const* what, bool may_leave,
                                                          call_record const* call) {
  if (members.size() == 1) return;
  if (call != nullptr && run->verdict_to_take(static_cast<std::size_t>(members[static_cast<std::size_t>(rank)])))
    fail(run->take_verdict(static_cast<std::size_t>(members[static_cast<std::size_t>(rank)])));
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
  sleep_until_passed(rank, what, generation, may_leave, call);
}

SHARDWISE_DETAIL_RUNTIME_ENTRY bool thread_group::sleeps_unpassed(thread_run_state::sleeping_wait const& w,
                                                                  std::vector<int>& waits_for) {
  thread_group const& g = *w.group;
  auto const generation_now = [&] { return static_cast<std::uint32_t>(g.word.load(std::memory_order_acquire)); };
  if (generation_now() != w.generation) return false;
  waits_for.clear();
  for (std::size_t q = 0; q < g.members.size(); ++q)
    if (g.own[q].arrival.load(std::memory_order_acquire) != w.generation + 1) waits_for.push_back(g.members[q]);
  return generation_now() == w.generation;
}

SHARDWISE_DETAIL_RUNTIME_ENTRY bool thread_group::withdraw(std::uint32_t generation) {
  std::uint64_t w = word.load();
  while (static_cast<std::uint32_t>(w) == generation)
    if (word.compare_exchange_weak(w, w - one_arrival)) return true;
  return false;
}

SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_group::sleep_until_passed(int rank, char const* what,
                                                                     std::uint32_t generation, bool may_leave,
                                                                     call_record const* call) {
  auto passed = [&] { return static_cast<std::uint32_t>(word.load(std::memory_order_acquire)) != generation; };
  auto const world_rank = static_cast<std::size_t>(members[static_cast<std::size_t>(rank)]);
  run->waiting_for[world_rank].store(what);
  run->waiting_in[world_rank].store(this);
  auto const now = [] { return std::chrono::steady_clock::now(); };
  auto const deadline = now() + wait_limit();
  auto next_check = now() + desync_first_check(wait_limit());
  auto const started = now();
  int notices = 0;
  auto next_notice = wait_notice_due(started, run->notice, 0);
  if (may_leave) announce_sleep(world_rank, what, generation, call);
  sleepers.fetch_add(1);
  struct leave {
    thread_group& group;
    std::size_t world_rank;
    bool announced;
    ~leave() {
      group.sleepers.fetch_sub(1);
      group.run->waiting_in[world_rank].store(nullptr);
      if (!announced) return;
      std::lock_guard const hold(group.run->desync_mutex);
      group.run->sleeping[world_rank] = {};
    }
  } const on_exit{*this, world_rank, may_leave};
  std::unique_lock lock(sleep_mutex);
  while (!passed()) {
    if (may_leave && (peers_cannot_arrive() || now() >= deadline || run->verdict_to_take(world_rank))) {
      lock.unlock();
      // A member may have passed this very barrier and then returned; a verdict then stays for the next call.
      if (!withdraw(generation)) return;
      if (run->verdict_to_take(world_rank)) fail(run->take_verdict(world_rank));
      check_peers(rank, what);  // throws: a peer failed or returned
      if (now() >= deadline) time_out(rank, what, generation);
      fail("shardwise::ThreadMesh: a peer of rank ", rank, " in ", what, " cannot arrive");
    }
    if (may_leave && now() >= next_check) {
      lock.unlock();
      run->check_desync(static_cast<int>(world_rank));
      next_check = now() + desync_recheck(wait_limit());
      lock.lock();
      continue;
    }
    if (may_leave && now() >= next_notice) {
      print_notice(rank, what, call, generation, notices);
      next_notice = wait_notice_due(started, run->notice, ++notices);
      continue;
    }
    if (may_leave)
      sleep_ready.wait_until(lock, std::min({deadline, next_check, next_notice}));
    else
      sleep_ready.wait(lock);
  }
}

SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_group::print_notice(int rank, char const* what, call_record const* call,
                                                               std::uint32_t generation, int k) const {
  std::vector<int> waiting;
  std::string missing;
  for (std::size_t q = 0; q < members.size(); ++q) {
    if (own[q].arrival.load() == generation + 1)
      waiting.push_back(static_cast<int>(q));
    else
      missing += (missing.empty() ? "" : "; ") + whereabouts(q);
  }
  if (waiting.empty() || waiting.front() != rank || missing.empty()) return;
  std::string const text =
      wait_notice_text(label, waiting, call ? call_text(*call) : what, missing, run->notice, k, wait_limit());
  std::fprintf(stderr, "%s\n", text.c_str());
  std::fflush(stderr);
}

SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_group::announce_sleep(std::size_t world_rank, char const* what,
                                                                 std::uint32_t generation, call_record const* call) {
  thread_run_state::sleeping_wait w;
  w.group = this, w.generation = generation, w.what = what;
  if (call != nullptr) w.call = *call, w.has_call = true;
  std::lock_guard const hold(run->desync_mutex);
  run->sleeping[world_rank] = w;
}
#endif

/// Looks at what every rank is doing; if world rank `me` sleeps in a wait that can never complete, every rank of
/// the axes of such waits gets the same error (desync_recipients), and is woken to raise it. A rank told before
/// counts as one that may arrive: it is leaving its wait.
#if SHARDWISE_DETAIL_RUNTIME_BODIES
SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_run_state::check_desync(int me) {
  std::vector<int> stuck;
  {
    std::lock_guard const hold(desync_mutex);
    if (has_verdict(static_cast<std::size_t>(me))) return;  // found already, for every rank then stuck
    std::map<int, rank_activity> reports;
    std::vector<int> waits_for;
    for (int r = 0; r < world_size; ++r) {
      auto const& w = sleeping[static_cast<std::size_t>(r)];
      if (finished[static_cast<std::size_t>(r)].load(std::memory_order_acquire))
        reports[r].what = rank_activity::state::finished;
      else if (w.group != nullptr && !has_verdict(static_cast<std::size_t>(r)) &&  // told: it leaves that wait
               thread_group::sleeps_unpassed(w, waits_for))
        reports[r] =
            waiting_activity(w.group->label, w.has_call ? &w.call : nullptr, w.what, waits_for, w.group->members);
    }
    stuck = stuck_ranks(reports);
    if (std::find(stuck.begin(), stuck.end(), me) == stuck.end()) return;
    std::string const message = desync_message(reports, stuck);
    for (int r : desync_recipients(reports, stuck)) {  // a rank told of a deadlock before keeps that message
      if (has_verdict(static_cast<std::size_t>(r))) continue;
      verdicts[static_cast<std::size_t>(r)] = message;
      verdict_ready[static_cast<std::size_t>(r)].store(true, std::memory_order_release);
    }
  }
  wake_all();
}

SHARDWISE_DETAIL_RUNTIME_ENTRY void thread_run_state::wake_all() {
  std::vector<std::shared_ptr<thread_group>> live;
  {
    std::lock_guard lock(registry_mutex);
    for (auto const& weak : groups)
      if (auto group = weak.lock()) live.push_back(std::move(group));
  }
  for (auto const& group : live) group->signal();
}
#endif

}  // namespace detail

}  // namespace shardwise
