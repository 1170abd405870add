# Checkpoints (issue 5): save, load and consolidate throughput against `cp` of the same bytes, and the peak RSS of
# each rank when a >= 1 GiB Llama is loaded lazily at TP 4 (bench/checkpoint.cpp, bench/run_checkpoint.sh).
# Included from bench/CMakeLists.txt.
if(NOT (TARGET shardwise::checkpoint AND TARGET shardwise::mpi AND TARGET shardwise::eigen))
  message(STATUS "shardwise: bench_checkpoint needs nlohmann_json, Boost.MPI and Eigen; not built")
  return()
endif()

add_executable(bench_checkpoint checkpoint.cpp)
target_link_libraries(bench_checkpoint PRIVATE shardwise::checkpoint shardwise::mpi shardwise::eigen)
target_compile_options(bench_checkpoint PRIVATE ${SHARDWISE_BENCH_FLAGS})

# The whole benchmark, on a 1.45 GiB model (needs ~7 GB of disk under the build folder and a few minutes).
# SHARDWISE_CHECKPOINT_BENCH_DIR picks another folder for the checkpoint files.
set(bench_checkpoint_launch ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 ${MPIEXEC_PREFLAGS})
add_custom_target(
  run_bench_checkpoint
  COMMAND ${CMAKE_COMMAND} -E env ${SHARDWISE_MPI_ENV} "BENCH_CHECKPOINT_MPIEXEC=${bench_checkpoint_launch}"
          bash ${CMAKE_CURRENT_SOURCE_DIR}/run_checkpoint.sh $<TARGET_FILE:bench_checkpoint>
          ${CMAKE_CURRENT_BINARY_DIR}/checkpoint_bench_files
  DEPENDS bench_checkpoint
  COMMENT "Running bench_checkpoint: throughput against cp, then peak RSS per rank at TP 4 (bench/run_checkpoint.sh)"
  USES_TERMINAL VERBATIM)

# Smoke: a tiny model, every step once, and one lazy load at TP 4 on 4 processes.
add_test(NAME bench_checkpoint.smoke
         COMMAND ${CMAKE_COMMAND} -E env "BENCH_CHECKPOINT_MPIEXEC=${bench_checkpoint_launch}"
                 bash ${CMAKE_CURRENT_SOURCE_DIR}/run_checkpoint.sh $<TARGET_FILE:bench_checkpoint>
                 ${CMAKE_CURRENT_BINARY_DIR}/checkpoint_bench_smoke --smoke)
set_tests_properties(bench_checkpoint.smoke PROPERTIES ENVIRONMENT "${SHARDWISE_MPI_ENV}" LABELS "mpi;bench"
                                                       TIMEOUT 120 PROCESSORS 2)
