#pragma once
// A string usable as a template argument: mesh axis names and (later) plan paths are spelled in types,
// so the compiler can check them and print them in diagnostics.
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace shardwise {

/// A string of N - 1 characters usable as a template argument: fixed_string<3>{"tp"}, or just "tp" where a
/// template parameter is a fixed_string.
template <std::size_t N>
struct fixed_string {
  char chars[N]{};  ///< The characters, including the terminating '\0'.

  constexpr fixed_string() = default;  ///< Every character '\0'.
  /// From a string literal; implicit, so that "tp" can be a template argument.
  constexpr fixed_string(const char (&text)[N]) { std::copy_n(text, N, chars); }  // NOLINT: implicit on purpose
  /// The characters.
  [[nodiscard]] constexpr std::string_view view() const { return {chars, N - 1}; }
  /// The length, without the '\0'.
  [[nodiscard]] static constexpr std::size_t size() { return N - 1; }

  /// Equal when the characters are, whatever the sizes.
  template <std::size_t M>
  constexpr bool operator==(fixed_string<M> const& other) const {
    return view() == other.view();
  }
};

/// "a" + "." + "b", or just one of them when the other is empty: plan paths are joined at compile time.
template <fixed_string A, fixed_string B>
constexpr auto join_path() {
  if constexpr (A.size() == 0) {
    return B;
  } else if constexpr (B.size() == 0) {
    return A;
  } else {
    fixed_string<A.size() + B.size() + 2> joined;
    std::copy_n(A.chars, A.size(), joined.chars);
    joined.chars[A.size()] = '.';
    std::copy_n(B.chars, B.size(), joined.chars + A.size() + 1);
    return joined;
  }
}

}  // namespace shardwise
