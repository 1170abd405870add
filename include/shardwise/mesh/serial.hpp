#pragma once
// One rank, no communication: the unsharded reference that every parallel result is compared with.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/thread/comm.hpp"

namespace shardwise {

/// The communicator of a single rank (serial_world): every collective is a copy or nothing.
class SerialComm {
 public:
  /// The collective algorithms: its one "peer" is itself, so the shared-memory ones apply.
  using collectives = detail::shared_memory_collectives;

  SerialComm() = default;  ///< The world, labelled "world".
  /// A communicator labelled `label` (the name errors give it).
  explicit SerialComm(std::string_view label) : label_(label) {}

  [[nodiscard]] static int rank() { return 0; }                        ///< Always 0.
  [[nodiscard]] static int size() { return 1; }                        ///< Always 1.
  [[nodiscard]] std::string_view label() const { return label_; }      ///< The name errors give it.
  static void barrier(char const* = "barrier") {}                      ///< Nothing to wait for.
  [[nodiscard]] static std::uint64_t next_call_number() { return 0; }  ///< No peer to match: always 0.
  static void set_timeout(timeout_duration) {}                         ///< Nothing to wait for: accepted and ignored.
  /// Nothing to wait for; what a thread or MPI world would use.
  [[nodiscard]] static timeout_duration timeout() { return detail::default_timeout(); }

  /// The collectives' exchange of buffers: calls fn with this rank's slot as the only one.
  template <class Fn>
  static void exchange(detail::thread_slot mine, char const*, Fn&& fn) {
    std::vector<detail::thread_slot> const slots{std::move(mine)};
    fn(slots);
  }

  /// Another single-rank communicator, labelled `label`.
  [[nodiscard]] SerialComm split(int, int, std::string_view label) const { return SerialComm(label); }

  /// Throws: a serial mesh has no peer to send to.
  void send_bytes(void const*, std::size_t, extents const&, int destination, int) const {
    detail::fail("shardwise::send on mesh axis \"", label_, "\": peer rank ", destination,
                 " does not exist; a serial mesh has one rank");
  }
  /// Throws: a serial mesh has no peer to receive from.
  template <class Take>
  void recv_bytes(int source, int, Take&&) const {
    detail::fail("shardwise::recv on mesh axis \"", label_, "\": peer rank ", source,
                 " does not exist; a serial mesh has one rank");
  }
  /// Throws, as recv_bytes.
  template <class Where>
  void recv_into(int source, int tag, Where&& where) const {
    recv_bytes(source, tag, where);
  }

 private:
  std::string label_ = "world";
};

/// The world of a single rank.
[[nodiscard]] inline SerialComm serial_world() { return {}; }

}  // namespace shardwise
