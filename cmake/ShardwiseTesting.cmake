# How tests, examples and benchmarks run: OpenMPI as root and with more ranks than cores, and fast start-up
# without network probing, set here once rather than by hand.
set(SHARDWISE_MPI_ENV
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader
    OMPI_MCA_rmaps_base_oversubscribe=1)
set(MPIEXEC_PREFLAGS --oversubscribe --bind-to none)

# shardwise_add_mpi_test(name target RANKS n...): runs target under mpiexec once per rank count.
function(shardwise_add_mpi_test name target)
  cmake_parse_arguments(A "" "" "RANKS;ARGS" ${ARGN})
  foreach(n IN LISTS A_RANKS)
    add_test(NAME ${name}.mpi${n}
             COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${n} ${MPIEXEC_PREFLAGS} $<TARGET_FILE:${target}>
                     ${MPIEXEC_POSTFLAGS} ${A_ARGS})
    set_tests_properties(${name}.mpi${n} PROPERTIES ENVIRONMENT "${SHARDWISE_MPI_ENV}" LABELS mpi TIMEOUT 300
                                                    PROCESSORS 2)
  endforeach()
endfunction()
