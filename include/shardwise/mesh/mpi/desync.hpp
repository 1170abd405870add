#pragma once
// The desync check of mesh/desync.hpp on MPI. Ranks are processes, so a rank that has waited in a collective
// for a few seconds asks the ranks it waits for — and those they wait for, as their answers say — what they
// are doing, on the side channel of the failure notices (a duplicate of the world). A rank answers whenever it
// polls: while it waits in any call, or before MPI_Finalize (then: it has finished). A rank that computes does
// not answer, and counts as one that may still arrive. An answer is used only when two rounds in a row gave the
// same one (a wait that just ended cannot pass for a stuck one). When the waits cannot complete, the rank sends
// the message to every rank of the stuck waits' axes (desync_recipients) and raises it; each raises it at its
// next poll, in the wait it is in or at the start of its next collective. Each verdict carries a number, and a
// rank's answers say the last number it took from the asker: until a rank has taken the asker's verdict, the
// asker decides nothing on it, so a rank still leaving the old wait cannot look like a new desync.
#include <mpi.h>

#include <algorithm>
#include <boost/mpi/environment.hpp>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/desync.hpp"
#include "shardwise/mesh/mpi/failure.hpp"

namespace shardwise::detail {

/// The side channel's tags (failure notices use 0).
enum mpi_side_tag : int { desync_query = 2, desync_answer = 3, desync_verdict_tag = 4 };

/// A collective wait of this process that takes part in the desync check: what it waits in, and how to find
/// the world ranks it still waits for (asked only when a check or a peer needs them).
struct mpi_wait {
  std::string_view axis;
  call_record const* call = nullptr;
  char const* what = "";
  std::vector<int> (*missing)(void const* context) = nullptr;  ///< World ranks not yet heard from.
  void const* context = nullptr;
  std::vector<int> (*members)(void const* context) = nullptr;  ///< World ranks of the axis.
  std::uint64_t serial = 0;  ///< Numbers the waits of this process, so that late messages are known as such.
};

/// A question of the check: "what are you doing?", numbered by the asker's wait and round.
struct mpi_desync_question {
  std::uint64_t asker_wait = 0;
  std::uint32_t round = 0;
};

/// An answer: the question's numbers, the answering rank's own wait, the number of the last verdict it took from
/// the asker, and its activity.
struct mpi_desync_reply {
  std::uint64_t asker_wait = 0;
  std::uint32_t round = 0;
  std::uint64_t own_wait = 0;
  std::uint64_t verdict_taken = 0;
  rank_activity activity;
};

/// What this process knows of the check: its current wait, and the last two answers of each rank it asked.
struct mpi_desync_state {
  mpi_wait const* current = nullptr;
  std::uint64_t waits = 0;
  bool finished = false;  ///< Before MPI_Finalize: it makes no more calls.
  struct heard {
    mpi_desync_reply last, before;
    bool has_last = false, has_before = false;
    std::uint32_t first_asked = ~0u;  ///< The round this wait first asked the rank.
  };
  std::map<int, heard> answers;             // world rank -> its answers to the current wait's questions
  std::uint64_t verdicts_sent = 0;          ///< Numbers this process's verdicts (1, 2, ...).
  std::map<int, std::uint64_t> owed;        ///< World rank -> the number of this process's verdict it must take.
  std::map<int, std::uint64_t> taken_from;  ///< World rank -> the number of the last verdict taken from it.
  struct verdict {
    int from = -1;
    std::uint64_t number = 0;
    std::string message;
  };
  std::optional<verdict> held;  ///< A verdict received while a test holds verdicts back.
  desync_test_holds test_holds;
};
/// Never destroyed: the wait before MPI_Finalize runs in the MPI environment's deleter, during static
/// destruction, and answers questions through this state.
inline mpi_desync_state& desync_state() {
  static mpi_desync_state& state = *new mpi_desync_state;
  return state;
}

inline int mpi_world_rank() {
  int me = -1;
  MPI_Comm_rank(notices().comm, &me);
  return me;
}

/// This process's activity as it answers a question.
inline rank_activity mpi_own_activity() {
  auto const& s = desync_state();
  if (s.finished) {
    rank_activity a;
    a.what = rank_activity::state::finished;
    return a;
  }
  if (s.current == nullptr) return {};
  mpi_wait const& w = *s.current;
  return waiting_activity(w.axis, w.call, w.what, w.missing(w.context), w.members(w.context));
}

/// Sends `bytes` to world rank `to` on the side channel without waiting (small: delivered eagerly). The bytes
/// are kept alive in a ring of recent messages, as MPI may read them after this returns.
inline void mpi_side_send(int to, int tag, void const* data, std::size_t bytes) {
  static std::vector<std::string>& in_flight = *new std::vector<std::string>(64);  // never destroyed: see above
  static std::size_t next = 0;
  std::string& copy = in_flight[next++ % in_flight.size()];
  copy.assign(static_cast<char const*>(data), bytes);
  MPI_Request request;
  MPI_Isend(copy.data(), static_cast<int>(copy.size()), MPI_BYTE, to, tag, notices().comm, &request);
  MPI_Request_free(&request);
}

/// Answers question `q` from world rank `asker` with what this process is doing.
inline void mpi_answer(int asker, mpi_desync_question const& q) {
  auto const& s = desync_state();
  auto const taken = s.taken_from.find(asker);
  mpi_desync_reply const reply{q.asker_wait, q.round, s.current ? s.current->serial : 0,
                               taken == s.taken_from.end() ? 0 : taken->second, mpi_own_activity()};
  mpi_side_send(asker, desync_answer, &reply, sizeof reply);
}

/// Raises verdict `v`, unless a test holds verdicts back: then it is kept, and raised at a later poll.
inline void mpi_take_verdict(mpi_desync_state::verdict v) {
  auto& s = desync_state();
  if (test_held(s.test_holds.verdicts_until)) {
    s.held = std::move(v);
    return;
  }
  s.held.reset();
  s.taken_from[v.from] = v.number;  // answers to its sender say so from now on
  fail(v.message);
}

/// Handles the messages of the side channel that have come: a peer's failure (raised), a question (answered),
/// an answer (kept), a desync verdict (raised, whatever this rank waits in: the check sends one only to ranks
/// of the stuck waits' axes). `what`, `axis`, `rank`: this rank's wait, for the failure message.
inline void mpi_poll_side_channel(char const* what, std::string_view axis, int rank) {
  auto& n = notices();
  auto& s = desync_state();
  if (n.comm == MPI_COMM_NULL || test_held(s.test_holds.quiet_until)) return;
  if (s.held) mpi_take_verdict(*s.held);
  for (;;) {
    int arrived = 0;
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, n.comm, &arrived, &status);
    if (!arrived) return;
    if (status.MPI_TAG == 0) return mpi_raise_notice(what, axis, rank);
    int length = 0;
    MPI_Get_count(&status, MPI_BYTE, &length);
    std::string bytes(static_cast<std::size_t>(length), '\0');
    MPI_Recv(bytes.data(), length, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, n.comm, MPI_STATUS_IGNORE);
    if (status.MPI_TAG == desync_query && bytes.size() == sizeof(mpi_desync_question)) {
      mpi_desync_question q;
      std::memcpy(&q, bytes.data(), sizeof q);
      mpi_answer(status.MPI_SOURCE, q);
    } else if (status.MPI_TAG == desync_answer && bytes.size() == sizeof(mpi_desync_reply)) {
      mpi_desync_reply r;
      std::memcpy(&r, bytes.data(), sizeof r);
      if (s.current == nullptr || r.asker_wait != s.current->serial) continue;  // for a wait that has ended
      auto& h = s.answers[status.MPI_SOURCE];
      h.before = h.last, h.has_before = h.has_last;
      h.last = r, h.has_last = true;
    } else if (status.MPI_TAG == desync_verdict_tag && bytes.size() > sizeof(std::uint64_t)) {
      std::uint64_t number = 0;  // the bytes: the verdict's number, then its message
      std::memcpy(&number, bytes.data(), sizeof number);
      mpi_take_verdict({status.MPI_SOURCE, number, bytes.substr(sizeof number)});
    }
  }
}

/// The ranks a wait depends on: those it waits for, and those their latest answers wait for, transitively.
inline std::vector<int> mpi_desync_closure(rank_activity const& mine, int me) {
  auto const& answers = desync_state().answers;
  std::vector<int> closure;
  std::map<int, bool> seen{{me, true}};
  std::vector<int> frontier(mine.waits_for.begin(), mine.waits_for.begin() + mine.waiting_for);
  while (!frontier.empty()) {
    int const r = frontier.back();
    frontier.pop_back();
    if (seen[r]) continue;
    seen[r] = true;
    closure.push_back(r);
    auto const h = answers.find(r);
    if (h == answers.end() || !h->second.has_last) continue;
    rank_activity const& a = h->second.last.activity;
    frontier.insert(frontier.end(), a.waits_for.begin(), a.waits_for.begin() + a.waiting_for);
  }
  return closure;
}

/// The reports the check may decide on in `round`: a rank's answer counts once the last two rounds gave it
/// alike. False while some rank of the closure is still unsettled (asked for less than two rounds, or answering
/// differently), so that the decision sees every rank it can. A rank that has not yet taken this process's last
/// verdict to it is leaving its wait: it may arrive.
inline bool mpi_settled_reports(std::vector<int> const& closure, std::uint32_t round,
                                std::map<int, rank_activity>& reports) {
  auto& s = desync_state();
  auto const& answers = s.answers;
  for (int r : closure) {
    auto const h = answers.find(r);
    if (h == answers.end() || h->second.first_asked == ~0u || h->second.first_asked + 2 > round) return false;
    auto const& a = h->second;
    bool const confirmed = a.has_before && a.last.round + 1 == round && a.before.round + 2 == round &&
                           a.last.activity == a.before.activity && a.last.own_wait == a.before.own_wait;
    bool const silent = !a.has_last || a.last.round + 2 <= round;  // computing: it may still arrive
    if (!confirmed && !silent) return false;
    if (!confirmed) continue;
    auto const owed = s.owed.find(r);
    if (owed != s.owed.end() && a.last.verdict_taken < owed->second &&
        a.last.activity.what == rank_activity::state::waiting)
      continue;
    if (owed != s.owed.end()) s.owed.erase(owed);
    reports[r] = a.last.activity;
  }
  return true;
}

/// One round of the check for the current wait: decides on the answers of the rounds before, then asks again
/// every rank the wait depends on. When the waits cannot complete, the lowest world rank among the stuck ones
/// (the others wait for its word, so that all raise the same message) tells every rank of the stuck waits' axes
/// (desync_recipients) and raises.
inline void mpi_desync_round(std::uint32_t round) {
  auto& s = desync_state();
  mpi_wait const& w = *s.current;
  int const me = mpi_world_rank();
  if (test_held(s.test_holds.quiet_until)) return;
  rank_activity const mine = mpi_own_activity();
  std::vector<int> const closure = mpi_desync_closure(mine, me);
  std::map<int, rank_activity> reports{{me, mine}};
  if (mpi_settled_reports(closure, round, reports)) {
    std::vector<int> const stuck = stuck_ranks(reports);
    if (!stuck.empty() && stuck.front() == me) {
      std::string const message = desync_message(reports, stuck);
      std::uint64_t const number = ++s.verdicts_sent;
      std::string bytes(sizeof number, '\0');  // the verdict's number, then its message
      std::memcpy(bytes.data(), &number, sizeof number);
      bytes += message;
      for (int r : desync_recipients(reports, stuck)) {
        if (r == me) continue;
        mpi_side_send(r, desync_verdict_tag, bytes.data(), bytes.size());
        s.owed[r] = number;
      }
      fail(message);
    }
  }
  mpi_desync_question const q{w.serial, round};
  for (int r : closure) {
    auto& h = s.answers[r];
    if (h.first_asked == ~0u) h.first_asked = round;
    mpi_side_send(r, desync_query, &q, sizeof q);
  }
}

/// Makes `w` the current wait of this process for the desync check while it lives.
class mpi_wait_scope {
 public:
  explicit mpi_wait_scope(mpi_wait& w) : previous_(desync_state().current) {
    auto& s = desync_state();
    w.serial = ++s.waits;
    s.current = &w;
  }
  mpi_wait_scope(mpi_wait_scope const&) = delete;
  mpi_wait_scope& operator=(mpi_wait_scope const&) = delete;
  ~mpi_wait_scope() {
    auto& s = desync_state();
    s.current = previous_;
    s.answers.clear();
  }

 private:
  mpi_wait const* previous_;
};

/// Answers the desync check's questions that have come (outside a wait: before MPI_Finalize).
inline void mpi_answer_questions() {
  for (int arrived = 1; arrived;) {
    MPI_Status status;
    MPI_Iprobe(MPI_ANY_SOURCE, desync_query, notices().comm, &arrived, &status);
    if (!arrived) return;
    mpi_desync_question q;
    MPI_Recv(&q, sizeof q, MPI_BYTE, status.MPI_SOURCE, desync_query, notices().comm, MPI_STATUS_IGNORE);
    mpi_answer(status.MPI_SOURCE, q);
  }
}

/// Before MPI_Finalize: waits until every rank has reached it. Once the job has failed (a failure notice arrived
/// here, before or during the wait, or this rank told its peers of its own), it ends this rank with exit code 1
/// instead: when every rank has arrived, or after a grace of a few seconds for the failed and failing ranks to
/// print their errors, since mpiexec stops the whole job at the first rank that exits with an error. OpenMPI's
/// MPI_Finalize waits for every peer, and a rank waiting there was seen to outlive MPI_Abort from its failing
/// peers by minutes (CI, 4 ranks on 2 cores). A peer that dies without a notice (a signal) is mpiexec's to
/// end, as before. Nothing to do when the program finalised MPI itself.
inline void mpi_await_peers_before_finalize() {
  auto& n = notices();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized || n.comm == MPI_COMM_NULL) return;
  using clock = std::chrono::steady_clock;
  constexpr auto grace = std::chrono::seconds(5);
  desync_state().finished = true;  // peers that ask are told so: this rank makes no more calls
  bool failed = n.heard || n.told;
  int failed_peer = -1;  // -1: known before the wait
  auto deadline = clock::now() + grace;
  MPI_Request all_here = MPI_REQUEST_NULL;
  MPI_Ibarrier(n.comm, &all_here);
  for (int done = 0;;) {
    MPI_Test(&all_here, &done, MPI_STATUS_IGNORE);
    if (done && !failed) return;
    if (done || (failed && clock::now() > deadline)) mpi_end_after_peer_failure(failed_peer);
    mpi_answer_questions();
    int arrived = 0;
    MPI_Status status;
    if (!failed) MPI_Iprobe(MPI_ANY_SOURCE, 0, n.comm, &arrived, &status);
    if (arrived) failed = true, failed_peer = status.MPI_SOURCE, deadline = clock::now() + grace;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

/// MPI is initialised once per process and finalised at exit, after every communicator is gone and every rank
/// has arrived (mpi_await_peers_before_finalize).
inline std::shared_ptr<boost::mpi::environment> mpi_environment(int* argc = nullptr, char*** argv = nullptr) {
  static std::shared_ptr<boost::mpi::environment> env = [&] {
    auto* raw = argc && argv ? new boost::mpi::environment(*argc, *argv) : new boost::mpi::environment();
    std::shared_ptr<boost::mpi::environment> made(raw, [](boost::mpi::environment* e) {
      mpi_await_peers_before_finalize();
      delete e;
    });
    MPI_Comm_dup(MPI_COMM_WORLD, &notices().comm);
    std::set_terminate(&mpi_terminate);
    return made;
  }();
  return env;
}

}  // namespace shardwise::detail
