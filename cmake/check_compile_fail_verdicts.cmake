# cmake -DCXX=<compiler> -DWORK=<empty folder> -DSCRIPT=<expect_compile_fail.cmake> -P check_compile_fail_verdicts.cmake
# The compile-fail tests' kept verdicts follow their inputs: a second run with nothing changed checks the kept
# output, a changed header compiles again (and its new message is seen), the kept output is checked against the
# patterns each run, and a failed verdict is never kept.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/probe.dir")
file(WRITE "${WORK}/probe.hpp" "constexpr char const* probe_words = \"first\";\n")
file(WRITE "${WORK}/probe.cpp" "#include \"probe.hpp\"\nstatic_assert(sizeof(int) == 0, \"shardwise::probe: the words\");\n")
file(WRITE "${WORK}/compile_commands.json"
     "[\n{\n  \"command\": \"${CXX} -std=c++20 -I${WORK} -o ${WORK}/probe.dir/probe.cpp.o -c ${WORK}/probe.cpp\",\n}\n]\n")

# Runs the test's script on the probe; `expect_ok` whether it must pass, `expect_kept` whether it must say it
# checked a kept output.
function(run_probe label expect expect_ok expect_kept)
  execute_process(COMMAND ${CMAKE_COMMAND} -DCOMMANDS=${WORK}/compile_commands.json -DTARGET=probe
                          "-DEXPECT=${expect}" -P "${SCRIPT}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  set(ok OFF)
  if(rc EQUAL 0)
    set(ok ON)
  endif()
  set(kept OFF)
  if(out MATCHES "the compiler's output kept in")
    set(kept ON)
  endif()
  if(NOT ok STREQUAL expect_ok OR NOT kept STREQUAL expect_kept)
    message(FATAL_ERROR "verdicts: ${label}: passed ${ok} (expected ${expect_ok}), kept output ${kept} "
                        "(expected ${expect_kept}):\n${out}")
  endif()
  message(STATUS "verdicts: ${label}: passed ${ok}, kept output ${kept}")
endfunction()

set(words "shardwise::probe: the words")
run_probe("first run" "${words}" ON OFF)
run_probe("nothing changed" "${words}" ON ON)
run_probe("a pattern the kept output lacks" "shardwise::probe: other words" OFF ON)
file(WRITE "${WORK}/probe.hpp" "constexpr char const* probe_words = \"second\";\nint x = ;\n")
run_probe("a header changed, a pattern its output lacks" "${words}|||no such words" OFF OFF)
run_probe("the same again (a failure is not kept)" "${words}|||no such words" OFF OFF)
set(both "${words}|||expected primary-expression|expected expression")  # g++'s words, clang's
run_probe("a header changed: its new error is seen" "${both}" ON OFF)
run_probe("nothing changed since" "${both}" ON ON)
file(READ "${WORK}/compile_commands.json" commands)
string(REPLACE " -c " " -DSHARDWISE_PROBE_FLAG -c " commands "${commands}")
file(WRITE "${WORK}/compile_commands.json" "${commands}")
run_probe("the command changed" "${both}" ON OFF)
file(WRITE "${WORK}/probe.cpp" "#include \"probe.hpp\"\n")
file(WRITE "${WORK}/probe.hpp" "constexpr int fine = 1;\n")
run_probe("the test's source compiles now" "${words}" OFF OFF)
message(STATUS "verdicts: every case as expected")
