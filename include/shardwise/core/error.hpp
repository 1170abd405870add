#pragma once
// Run-time errors carry the same words as the compile-time checks: what failed, where, and the fix.
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace shardwise {

/// Thrown for bad input that could not be checked at compile time (sizes, shapes, ranks).
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

template <class... Parts>
[[nodiscard]] std::string concat(Parts const&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

template <class... Parts>
[[noreturn]] void fail(Parts const&... parts) {
  throw error(concat(parts...));
}

}  // namespace detail

/// Throws sw::error with the parts written one after another: for a module's own checks, in the library's words.
template <class... Parts>
[[noreturn]] void raise(Parts const&... parts) {
  detail::fail(parts...);
}

}  // namespace shardwise
