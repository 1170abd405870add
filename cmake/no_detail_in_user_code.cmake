# Fails when code a user reads or copies — examples, benchmarks, docs, README — names shardwise::detail (internals
# are never needed there). A compiler diagnostic quoted in the docs (a line starting "error:") may show one.
file(GLOB_RECURSE files ${SOURCE_DIR}/examples/* ${SOURCE_DIR}/bench/*.cpp ${SOURCE_DIR}/bench/*.hpp
     ${SOURCE_DIR}/docs/*.md ${SOURCE_DIR}/README.md)
set(found "")
foreach(file IN LISTS files)
  file(STRINGS ${file} lines REGEX "detail::")
  foreach(line IN LISTS lines)
    if(NOT line MATCHES "^error: ")
      string(APPEND found "\n  ${file}: ${line}")
    endif()
  endforeach()
endforeach()
if(found)
  message(FATAL_ERROR "shardwise::detail named in user-facing code (use the public API):${found}")
endif()
list(LENGTH files count)
message(STATUS "no shardwise::detail in ${count} user-facing files")
