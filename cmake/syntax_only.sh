#!/bin/sh
# A compiler launcher for compile checks (compile-fail twins, header self-containment): they need the
# compiler's verdict, not object code, so the command runs with -fsyntax-only (templates are still
# instantiated, static_asserts still fire), then an empty object file is left where the build tool expects one.
out=
prev=
for arg in "$@"; do
  [ "$prev" = "-o" ] && out=$arg
  prev=$arg
done
"$@" -fsyntax-only || exit $?
if [ -n "$out" ]; then : >"$out"; fi
