# Fails unless the object file OBJECT calls the separately compiled runtime (shardwise::separate_runtime) instead of
# compiling its own copy: the collectives, the MPI side and the thread mesh's own code (running the rank threads,
# splitting a group, the barrier and its waits). A caller whose signature drifted from the library's declarations
# would compile them inline again and still link, silently losing the build-time gain.
execute_process(COMMAND nm -C ${OBJECT} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm failed on ${OBJECT}")
endif()
foreach(name IN ITEMS "runtime_collectives::all_reduce<float>" "runtime_collectives::all_gather<float, "
                      "runtime_collectives::reduce_scatter<float, " "runtime_mpi<shardwise::MpiComm>::split"
                      "runtime_mpi<shardwise::MpiComm>::world" "detail::run_rank_threads" "ThreadComm::split")
  if(NOT symbols MATCHES "\n *U [^\n]*${name}")
    message(FATAL_ERROR "WRONG: ${OBJECT} does not call ${name} from shardwise::separate_runtime")
  endif()
  if(symbols MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*${name}")
    message(FATAL_ERROR "WRONG: ${OBJECT} compiles its own ${name}")
  endif()
endforeach()
# Nor the thread mesh's barrier, its waits and the desync check behind them.
if(symbols MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*(shardwise::detail::thread_group::|shardwise::detail::thread_run_|shardwise::detail::desync_)")
  message(FATAL_ERROR "WRONG: ${OBJECT} compiles the thread mesh's own code: ${CMAKE_MATCH_0}")
endif()
# Nor does it parse or compile anything of MPI's: the MPI side is reached only through the library.
if(symbols MATCHES "\n[0-9a-f]+ [TtWw] [^\n]*(shardwise::MpiComm::|boost::mpi::|shardwise::detail::mpi_)")
  message(FATAL_ERROR "WRONG: ${OBJECT} compiles MPI code of its own: ${CMAKE_MATCH_0}")
endif()
message("the object file calls the separately compiled runtime and compiles no MPI code")
