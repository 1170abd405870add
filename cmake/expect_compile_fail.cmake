# cmake -DCOMMANDS=<compile_commands.json> -DTARGET=<name> -DEXPECT=<patterns> -P expect_compile_fail.cmake
# Compiles TARGET's source exactly as the build would (its command in compile_commands.json), with
# -fsyntax-only: a compile-fail test needs the verdict and the message, not code. Going around the build tool
# lets these tests run in parallel (two builds of one tree at once are not safe).
file(STRINGS "${COMMANDS}" commands REGEX "\"command\": .*/${TARGET}\\.dir/")
list(LENGTH commands found)
if(NOT found EQUAL 1)
  message(FATAL_ERROR "expected one compile command for ${TARGET} in ${COMMANDS}, found ${found}")
endif()
string(REGEX REPLACE "^ *\"command\": \"(.*)\",? *$" "\\1" command "${commands}")
string(REPLACE "\\\"" "\"" command "${command}")
string(REPLACE "\\\\" "\\" command "${command}")
separate_arguments(command UNIX_COMMAND "${command}")
get_filename_component(directory "${COMMANDS}" DIRECTORY)
execute_process(COMMAND ${command} -fsyntax-only WORKING_DIRECTORY "${directory}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled but must not:\n${out}")
endif()
# A compiler that crashes on the library's diagnostics has not shown the user the message, whatever it printed.
if(out MATCHES "PLEASE submit a bug report|internal compiler error|Segmentation fault|frontend command failed")
  message(FATAL_ERROR "the compiler crashed on ${TARGET}:\n${out}")
endif()
if(NOT EXPECT)
  message(FATAL_ERROR "compile-fail test ${TARGET} has no EXPECT message to look for")
endif()
# EXPECT is a list: the library's message and, where there is one, the offending name it prints.
string(REPLACE "|||" ";" patterns "${EXPECT}")
foreach(pattern IN LISTS patterns)
  if(NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "${TARGET} failed, but not with /${pattern}/:\n${out}")
  endif()
endforeach()
