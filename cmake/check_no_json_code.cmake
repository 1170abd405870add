# Fails unless the object file OBJECT calls each function of CALLS (qualified names, separated by commas) from
# shardwise::separate_checkpoint and defines no JSON code of its own: the checkpoint headers keep their JSON behind
# the library's entry points, so a file that links the library need not parse nlohmann/json.hpp.
execute_process(COMMAND nm -C ${OBJECT} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${OBJECT}")
endif()
string(REPLACE "," ";" functions "${CALLS}")
foreach(name IN LISTS functions)
  if(NOT symbols MATCHES "\n *U [^\n]*${name}\\(")
    message(FATAL_ERROR "WRONG: ${OBJECT} does not call ${name} from shardwise::separate_checkpoint")
  endif()
endforeach()
if(symbols MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*nlohmann::")
  message(FATAL_ERROR "WRONG: ${OBJECT} compiles JSON code of its own: ${CMAKE_MATCH_0}")
endif()
message("the object file calls ${CALLS} from shardwise::separate_checkpoint and compiles no JSON code")
