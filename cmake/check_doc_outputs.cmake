# Checks that each command output quoted in a doc is what the command prints now:
#   <!-- output: shardwise ARGS -->\n```\n<its stdout and stderr>```
# The command runs from SOURCE_DIR with SHARDWISE (the built `shardwise` program) in place of "shardwise". Timings
# ("in 8.1 ms") are not compared. With -DWRITE=ON the doc's blocks are replaced by the outputs instead.
# -D: DOC, SOURCE_DIR, SHARDWISE, WRITE (optional).
file(READ ${DOC} doc)
string(REGEX MATCHALL "<!-- output: shardwise [^\n]* -->\n```\n" heads "${doc}")
if(NOT heads)
  message(FATAL_ERROR "${DOC} quotes no command output (<!-- output: shardwise ... -->)")
endif()
set(failed "")
foreach(head IN LISTS heads)
  string(REGEX REPLACE "<!-- output: shardwise ([^\n]*) -->\n```\n" "\\1" arguments "${head}")
  separate_arguments(argv UNIX_COMMAND "${arguments}")
  execute_process(COMMAND ${SHARDWISE} ${argv} WORKING_DIRECTORY ${SOURCE_DIR} OUTPUT_VARIABLE out
                  ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 120)
  set(actual "${out}${err}")
  string(FIND "${doc}" "${head}" start)
  string(LENGTH "${head}" head_length)
  math(EXPR body_start "${start} + ${head_length}")
  string(SUBSTRING "${doc}" ${body_start} -1 rest)
  string(FIND "${rest}" "```" body_length)
  string(SUBSTRING "${rest}" 0 ${body_length} quoted)
  string(REGEX REPLACE " in [0-9.]+ ms" " in (time) ms" quoted_norm "${quoted}")
  string(REGEX REPLACE " in [0-9.]+ ms" " in (time) ms" actual_norm "${actual}")
  if(quoted_norm STREQUAL actual_norm)
    message("shardwise ${arguments}: as quoted")
  elseif(WRITE)
    string(SUBSTRING "${doc}" 0 ${body_start} before)
    string(SUBSTRING "${rest}" ${body_length} -1 after)
    set(doc "${before}${actual}${after}")
    file(WRITE ${DOC} "${doc}")
    message("shardwise ${arguments}: written into ${DOC}")
  else()
    message("shardwise ${arguments} (exit ${rc}) now prints:\n${actual}\n${DOC} quotes:\n${quoted}")
    string(APPEND failed "  shardwise ${arguments}\n")
  endif()
endforeach()
if(failed)
  message(FATAL_ERROR "${DOC} quotes outputs that the commands no longer print:\n${failed}Run\n  cmake -DDOC=${DOC} "
                      "-DSOURCE_DIR=${SOURCE_DIR} -DSHARDWISE=${SHARDWISE} -DWRITE=ON -P ${CMAKE_CURRENT_LIST_FILE}\n"
                      "and read the new numbers against the doc's text.")
endif()
