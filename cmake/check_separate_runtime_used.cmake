# Fails unless the object file OBJECT calls the separately compiled runtime (shardwise::separate_runtime) instead of
# compiling its own copy: a caller whose signature drifted from the extern declarations would compile the thread and
# MPI algorithms inline again and still link, silently losing the build-time gain.
execute_process(COMMAND nm -C ${OBJECT} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${OBJECT}")
endif()
foreach(name IN ITEMS "runtime_collectives::all_reduce<float>" "runtime_collectives::all_gather<float, "
                      "runtime_collectives::reduce_scatter<float, " "runtime_mpi<shardwise::MpiComm>::split"
                      "runtime_mpi<shardwise::MpiComm>::world")
  if(NOT symbols MATCHES "\n *U [^\n]*${name}")
    message(FATAL_ERROR "WRONG: ${OBJECT} does not call ${name} from shardwise::separate_runtime")
  endif()
  if(symbols MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*${name}")
    message(FATAL_ERROR "WRONG: ${OBJECT} compiles its own ${name}")
  endif()
endforeach()
# Nor does it parse or compile anything of MPI's: the MPI side is reached only through the library.
if(symbols MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*(shardwise::MpiComm::|boost::mpi::|shardwise::detail::mpi_)")
  message(FATAL_ERROR "WRONG: ${OBJECT} compiles MPI code of its own: ${CMAKE_MATCH_0}")
endif()
message("the object file calls the separately compiled runtime and compiles no MPI code")
