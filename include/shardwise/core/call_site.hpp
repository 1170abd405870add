#pragma once
// Where a call was made, for error messages. std::source_location would do, but libstdc++'s needs a compiler
// builtin that clang 14 lacks; __builtin_FILE/__builtin_LINE in a defaulted argument give the same: the
// caller's place.
namespace shardwise {

/// The file and line of a call: a defaulted `call_site where = {}` parameter takes its caller's place, so
/// the collectives name the line of each rank's call when ranks disagree or time out.
struct call_site {
  char const* file;  ///< The caller's file, as the compiler spelled it.
  unsigned line;     ///< The caller's line.
  /// The place of the call whose defaulted argument this is.
  constexpr call_site(char const* file_name = __builtin_FILE(), unsigned line_number = __builtin_LINE())  // NOLINT
      : file(file_name), line(line_number) {}
};

}  // namespace shardwise
