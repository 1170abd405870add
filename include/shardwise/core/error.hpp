#pragma once
// Run-time errors carry the same words as the compile-time checks: what failed, where, and the fix.
#include <initializer_list>
#include <ostream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace shardwise {

/// Thrown for bad input that could not be checked at compile time (sizes, shapes, ranks).
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {

/// One part of a message, without its type: concat and fail then compile one loop per file, not one per
/// combination of argument types (a program made hundreds of them).
struct message_part {
  void const* value;
  void (*write)(std::ostream& out, void const* value);
};

template <class T>
void write_message_part(std::ostream& out, void const* value) {
  out << *static_cast<T const*>(value);
}
inline void write_text_part(std::ostream& out, void const* value) { out << static_cast<char const*>(value); }

template <class T>
message_part part_of(T const& value) {
  if constexpr (std::is_array_v<T> && std::is_same_v<std::remove_extent_t<T>, char>)
    return {value, &write_text_part};  // every string literal shares one writer
  else
    return {&value, &write_message_part<T>};
}

inline std::string concat_parts(std::initializer_list<message_part> parts) {
  std::ostringstream out;
  for (auto const& part : parts) part.write(out, part.value);
  return out.str();
}

[[noreturn]] inline void fail_with(std::initializer_list<message_part> parts) { throw error(concat_parts(parts)); }

template <class... Parts>
[[nodiscard]] std::string concat(Parts const&... parts) {
  return concat_parts({part_of(parts)...});
}

template <class... Parts>
[[noreturn]] void fail(Parts const&... parts) {
  fail_with({part_of(parts)...});
}

}  // namespace detail

/// Throws sw::error with the parts written one after another: for a module's own checks, in the library's words.
template <class... Parts>
[[noreturn]] void raise(Parts const&... parts) {
  detail::fail(parts...);
}

}  // namespace shardwise
