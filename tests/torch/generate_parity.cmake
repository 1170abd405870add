# sw::generate against transformers' generate (included from tests/CMakeLists.txt): generate_reference.py prepares
# three random save_pretrained folders (grouped-query Llama as shards, a tied Llama with one key-value head, GPT-2)
# and the prompts; generate_dump (shardwise) loads each lazily and writes its greedy generations in fp32 and fp64
# and a sampled one with its draws; generate_reference.py runs transformers on the same folders and compares tokens,
# every step's logits and the sampling rule. The thread test runs tp 1, 2 and 4 and the example `generate` on each
# folder; the MPI tests 2 and 4 ranks. Each its own folder, so they can run side by side.
add_executable(generate_dump ${CMAKE_CURRENT_LIST_DIR}/generate_dump.cpp)
target_link_libraries(generate_dump PRIVATE shardwise::eigen shardwise::checkpoint)
if(TARGET shardwise::mpi)
  target_link_libraries(generate_dump PRIVATE shardwise::mpi)
else()
  target_compile_definitions(generate_dump PRIVATE SHARDWISE_DUMP_WITHOUT_MPI)
endif()

set(generate_tests torch.generate_parity.threads)
if(TARGET shardwise::mpi)
  list(APPEND generate_tests torch.generate_parity.mpi2 torch.generate_parity.mpi4)
endif()

if(SHARDWISE_PYTHON)
  set(reference ${CMAKE_CURRENT_LIST_DIR}/generate_reference.py)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/generate_threads)
  set(example_flag)
  if(SHARDWISE_BUILD_EXAMPLES AND TARGET shardwise::mpi)  # examples/CMakeLists.txt builds it then
    set(example_flag "--example '$<TARGET_FILE:generate>'")
  endif()
  add_test(NAME torch.generate_parity.threads
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' prepare '${dir}' && '$<TARGET_FILE:generate_dump>' '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' compare '${dir}' ${example_flag} tp1 tp2 tp3 tp4")
  set_tests_properties(torch.generate_parity.threads PROPERTIES LABELS torch TIMEOUT 900
                       PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed")
  if(TARGET shardwise::mpi)
    string(JOIN " " preflags ${MPIEXEC_PREFLAGS})
    foreach(n IN ITEMS 2 4)
      set(dir ${CMAKE_CURRENT_BINARY_DIR}/generate_mpi${n})
      add_test(NAME torch.generate_parity.mpi${n}
               COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ${SHARDWISE_MPI_ENV}
                       sh -c "rm -rf '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' prepare '${dir}' && '${MPIEXEC_EXECUTABLE}' ${MPIEXEC_NUMPROC_FLAG} ${n} ${preflags} '$<TARGET_FILE:generate_dump>' --mpi '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' compare '${dir}' mpi${n}")
      set_tests_properties(torch.generate_parity.mpi${n} PROPERTIES LABELS "torch;mpi" TIMEOUT 900
                           PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed" PROCESSORS 2)
    endforeach()
  endif()
else()
  # Not skipped silently: each comparison is still registered, as a test that fails and says how to get PyTorch.
  foreach(test IN LISTS generate_tests)
    add_test(NAME ${test} COMMAND ${CMAKE_COMMAND} -E echo
             "${test} needs PyTorch and transformers: SHARDWISE_PYTHON is not set; run scripts/torch-venv.sh and"
             "configure with -DSHARDWISE_PYTHON=<its output>")
    set_tests_properties(${test} PROPERTIES LABELS torch WILL_FAIL ON)
  endforeach()
endif()
