#pragma once
// A string usable as a template argument: mesh axis names and (later) plan paths are spelled in types,
// so the compiler can check them and print them in diagnostics.
#include <algorithm>
#include <cstddef>
#include <string_view>
#include <utility>

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

namespace detail {
/// A string's characters as a pack: clang 14 prints a fixed_string template argument as numbers
/// ({{112, 112, 0}}) but characters as characters, so compile errors carry this beside it.
template <char... Chars>
struct text {};

template <fixed_string S, class Indices = std::make_index_sequence<S.size()>>
struct spell;
template <fixed_string S, std::size_t... I>
struct spell<S, std::index_sequence<I...>> {
  using type = text<S.chars[I]...>;
};
/// The last, defaulted parameter of the incomplete types that show a path in a diagnostic: g++ and clang 15+
/// omit it (they print the fixed_string as text already); clang 14 prints it.
template <fixed_string S>
using spelled_t = typename spell<S>::type;
}  // namespace detail

}  // namespace shardwise
