#pragma once
// One rank, no communication: the unsharded reference that every parallel result is compared with.
#include <string>
#include <string_view>
#include <vector>

#include "shardwise/core/error.hpp"
#include "shardwise/mesh/thread.hpp"

namespace shardwise {

class SerialComm {
 public:
  static constexpr bool shared_memory = true;  // its one "peer" is itself, so the zero-copy path applies

  SerialComm() = default;
  explicit SerialComm(std::string_view label) : label_(label) {}

  [[nodiscard]] static int rank() { return 0; }
  [[nodiscard]] static int size() { return 1; }
  [[nodiscard]] std::string_view label() const { return label_; }
  static void barrier(char const* = "barrier") {}

  template <class Fn>
  static void exchange(detail::thread_slot mine, char const*, Fn&& fn) {
    std::vector<detail::thread_slot> const slots{std::move(mine)};
    fn(slots);
  }

  [[nodiscard]] SerialComm split(int, int, std::string_view label) const { return SerialComm(label); }

  void send_bytes(void const*, std::size_t, extents const&, int destination, int) const {
    detail::fail("shardwise::send on mesh axis \"", label_, "\": peer rank ", destination,
                 " does not exist; a serial mesh has one rank");
  }
  template <class Take>
  void recv_bytes(int source, int, Take&&) const {
    detail::fail("shardwise::recv on mesh axis \"", label_, "\": peer rank ", source,
                 " does not exist; a serial mesh has one rank");
  }
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
