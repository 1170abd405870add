# Training against Hugging Face transformers in fp64 (included from tests/CMakeLists.txt): transformers_dump
# (shardwise) writes each family's model (Llama 3.2- and 3.1-like, Qwen2.5-, Qwen3-, Mistral- and SmolLM2-like, and
# GPT-2), its initial weights under transformers' names, the logits, loss and every gradient of one batch, and the
# losses and clipped global norms of 5 AdamW steps; transformers_reference.py runs transformers' classes on the same
# weights with torch.optim.AdamW and compares within 1e-10; on threads, training under a learning-rate schedule and
# seven schedules' rates against get_scheduler too, and LoRA adapters against peft (trained, and in peft's files
# both ways: "prepare" writes an adapter as peft saves it before transformers_dump loads it). One test per
# backend: the thread mesh (unsharded, TP 1, and 2 and 4 (SmolLM2: 3) with and without sequence parallelism) and MPI at 2 and 4 ranks; each its own dump
# directory, so they can run side by side.
add_executable(transformers_dump ${CMAKE_CURRENT_LIST_DIR}/transformers_dump.cpp)
target_include_directories(transformers_dump PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(transformers_dump PRIVATE shardwise::eigen)
if(TARGET shardwise::checkpoint)  # it saves, loads and consolidates checkpoints
  target_link_libraries(transformers_dump PRIVATE shardwise::checkpoint)
endif()
if(TARGET shardwise::mpi)
  target_link_libraries(transformers_dump PRIVATE shardwise::mpi)
else()
  target_compile_definitions(transformers_dump PRIVATE SHARDWISE_DUMP_WITHOUT_MPI)
endif()

set(transformers_tests torch.transformers_training_parity.threads)
if(TARGET shardwise::mpi)
  list(APPEND transformers_tests torch.transformers_training_parity.mpi2 torch.transformers_training_parity.mpi4)
endif()

if(SHARDWISE_PYTHON)
  set(reference ${CMAKE_CURRENT_LIST_DIR}/transformers_reference.py)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/transformers_training_threads)
  add_test(NAME torch.transformers_training_parity.threads
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${dir}' && mkdir -p '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' '${dir}' prepare && '$<TARGET_FILE:transformers_dump>' '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' '${dir}' threads")
  set_tests_properties(torch.transformers_training_parity.threads PROPERTIES LABELS torch TIMEOUT 900
                       PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed")
  if(TARGET shardwise::mpi)
    string(JOIN " " preflags ${MPIEXEC_PREFLAGS})
    foreach(n IN ITEMS 2 4)
      set(dir ${CMAKE_CURRENT_BINARY_DIR}/transformers_training_mpi${n})
      add_test(NAME torch.transformers_training_parity.mpi${n}
               COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ${SHARDWISE_MPI_ENV}
                       sh -c "rm -rf '${dir}' && '${MPIEXEC_EXECUTABLE}' ${MPIEXEC_NUMPROC_FLAG} ${n} ${preflags} '$<TARGET_FILE:transformers_dump>' --mpi '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' '${dir}' mpi${n}")
      set_tests_properties(torch.transformers_training_parity.mpi${n} PROPERTIES LABELS "torch;mpi" TIMEOUT 900
                           PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed" PROCESSORS 2)
    endforeach()
  endif()
else()
  # Not skipped silently: each comparison is still registered, as a test that fails and says how to get PyTorch.
  foreach(test IN LISTS transformers_tests)
    add_test(NAME ${test} COMMAND ${CMAKE_COMMAND} -E echo
             "${test} needs PyTorch and transformers: SHARDWISE_PYTHON is not set; run scripts/torch-venv.sh and"
             "configure with -DSHARDWISE_PYTHON=<its output>")
    set_tests_properties(${test} PROPERTIES LABELS torch WILL_FAIL ON)
  endforeach()
endif()
