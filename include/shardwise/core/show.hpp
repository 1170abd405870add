#pragma once
// Compile errors that spell what is wrong: an incomplete type whose template arguments carry the offending
// path, size or layout is instantiated where a check fails, beside the static_assert with the library's words.

namespace shardwise::detail {

/// Names T (incomplete on purpose) in a compile error. Use it as `using shown = decltype(show_incomplete<T>())`:
/// the body is instantiated to deduce the return type, so the error appears, but never evaluated, and the
/// function that names it stays valid for constant evaluation (clang 14 crashes evaluating one that is not).
template <class T>
auto show_incomplete() {
  [[maybe_unused]] T offending;
  return true;
}

}  // namespace shardwise::detail
