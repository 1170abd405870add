# Runs one MPI fault (tests/mpi_fault_runner.cpp) and requires what the reliability issue promises: a
# non-zero exit, every EXPECT regex in the output, and an end within LIMIT seconds (never a hang).
# -D: MPIEXEC, RANKS, RUNNER, MODE, LIMIT, EXPECT (a ;-list).
string(TIMESTAMP start "%s")
execute_process(COMMAND ${MPIEXEC} -n ${RANKS} ${RUNNER} ${MODE} RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err TIMEOUT 120)
string(TIMESTAMP stop "%s")
math(EXPR seconds "${stop} - ${start}")
set(all "${out}${err}")
message("exit: ${rc}; ${seconds} s; output:\n${all}")
if(rc EQUAL 0)
  message(FATAL_ERROR "mode ${MODE}: exited 0; a fault must end the job with a non-zero exit")
endif()
if(seconds GREATER LIMIT)
  message(FATAL_ERROR "mode ${MODE}: took ${seconds} s, more than ${LIMIT} s")
endif()
foreach(expected IN LISTS EXPECT)
  if(NOT all MATCHES "${expected}")
    message(FATAL_ERROR "mode ${MODE}: the output lacks \"${expected}\"")
  endif()
endforeach()
