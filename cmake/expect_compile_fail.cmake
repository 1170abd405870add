# cmake -DCOMMANDS=<compile_commands.json> -DTARGET=<name> -DEXPECT=<patterns> -P expect_compile_fail.cmake
# Compiles TARGET's source exactly as the build would (its command in compile_commands.json), with
# -fsyntax-only: a compile-fail test needs the verdict and the message, not code. Going around the build tool
# lets these tests run in parallel (two builds of one tree at once are not safe).
#
# The compiler's output is kept in <build>/compile_fail_verdicts with what decided it: the compiler's version, the
# command, and every file the preprocessor read (the compiler's own list, -M) with its SHA-256. When none of these
# changed, the kept output is checked again instead of compiling again, as a compiler cache's direct mode does;
# any change to the compiler, its flags, the test or a header it reads compiles it anew.
cmake_policy(VERSION 3.20)
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
if(NOT EXPECT)
  message(FATAL_ERROR "compile-fail test ${TARGET} has no EXPECT message to look for")
endif()

# What decides the verdict, as text: the compiler's version, the command, and each file read with its hash.
function(verdict_inputs out files)
  list(GET command 0 compiler)
  execute_process(COMMAND ${compiler} --version OUTPUT_VARIABLE version ERROR_VARIABLE version)
  set(text "${version}\n${command}\n")
  foreach(file IN LISTS files)
    if(NOT EXISTS "${file}")
      set(${out} "" PARENT_SCOPE)  # a file it read is gone: no kept verdict can stand
      return()
    endif()
    file(SHA256 "${file}" hash)
    string(APPEND text "${hash} ${file}\n")
  endforeach()
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

set(kept "${directory}/compile_fail_verdicts/${TARGET}")
set(reused OFF)
if(EXISTS "${kept}.files" AND EXISTS "${kept}.inputs" AND EXISTS "${kept}.output")
  file(STRINGS "${kept}.files" files)
  verdict_inputs(inputs "${files}")
  file(READ "${kept}.inputs" kept_inputs)
  if(inputs AND inputs STREQUAL kept_inputs)
    file(READ "${kept}.output" out)
    set(rc 1)  # only a failed compile is kept
    set(reused ON)
    list(LENGTH files count)
    message(STATUS "${TARGET}: the compiler's output kept in ${kept}.output "
                   "(compiler, command and the ${count} files it reads unchanged)")
  endif()
endif()

if(NOT reused)
  execute_process(COMMAND ${command} -fsyntax-only WORKING_DIRECTORY "${directory}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled but must not:\n${out}")
endif()
# A compiler that crashes on the library's diagnostics has not shown the user the message, whatever it printed.
if(out MATCHES "PLEASE submit a bug report|internal compiler error|Segmentation fault|frontend command failed")
  message(FATAL_ERROR "the compiler crashed on ${TARGET}:\n${out}")
endif()
# EXPECT is a list: the library's message and, where there is one, the offending name it prints.
string(REPLACE "|||" ";" patterns "${EXPECT}")
foreach(pattern IN LISTS patterns)
  if(NOT out MATCHES "${pattern}")
    message(FATAL_ERROR "${TARGET} failed, but not with /${pattern}/:\n${out}")
  endif()
endforeach()

# Keep a verdict for the next run: the files the preprocessor reads (with a precompiled header in the command,
# -M still lists the headers it holds), then the inputs. Each file is written whole and renamed into place, the
# inputs last, so an interrupted or concurrent run leaves either no verdict or a whole one.
if(NOT reused AND NOT rc EQUAL 0)
  string(RANDOM LENGTH 12 tag)
  set(depfile "${kept}.${tag}.d")
  file(MAKE_DIRECTORY "${directory}/compile_fail_verdicts")
  set(listing ${command})  # without its -o: -M would leave an empty object file there
  list(FIND listing "-o" at)
  if(at GREATER -1)
    list(REMOVE_AT listing ${at})
    list(REMOVE_AT listing ${at})
  endif()
  execute_process(COMMAND ${listing} -M -MF "${depfile}" WORKING_DIRECTORY "${directory}"
                  RESULT_VARIABLE deps_rc OUTPUT_QUIET ERROR_QUIET)
  if(deps_rc EQUAL 0 AND EXISTS "${depfile}")
    file(READ "${depfile}" deps)
    file(REMOVE "${depfile}")
    string(REGEX REPLACE "^[^:]*: *" "" deps "${deps}")  # the rule's target
    string(REGEX REPLACE "\\\\\n" " " deps "${deps}")
    string(STRIP "${deps}" deps)
    separate_arguments(files UNIX_COMMAND "${deps}")
    set(absolute)
    foreach(file IN LISTS files)
      get_filename_component(file "${file}" ABSOLUTE BASE_DIR "${directory}")
      list(APPEND absolute "${file}")
    endforeach()
    list(REMOVE_DUPLICATES absolute)
    verdict_inputs(inputs "${absolute}")
    if(inputs)
      list(JOIN absolute "\n" listed)
      file(WRITE "${kept}.${tag}.files" "${listed}")
      file(WRITE "${kept}.${tag}.output" "${out}")
      file(WRITE "${kept}.${tag}.inputs" "${inputs}")
      foreach(part IN ITEMS files output inputs)
        file(RENAME "${kept}.${tag}.${part}" "${kept}.${part}")
      endforeach()
    endif()
  else()
    file(REMOVE "${depfile}")
  endif()
endif()
