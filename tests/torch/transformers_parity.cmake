# Tied word embeddings against Hugging Face transformers (included from tests/CMakeLists.txt): transformers_dump
# (shardwise) writes the Llama with tie_word_embeddings, the same model as a Qwen2 (biases on q, k and v, a yarn
# rotary scaling) and the GPT-2 model, their initial weights under
# transformers' names, the logits, loss and every gradient of one batch, and the losses and clipped global norms of
# 5 AdamW steps; transformers_reference.py runs LlamaForCausalLM(tie_word_embeddings=True), Qwen2ForCausalLM and
# GPT2LMHeadModel on
# the same weights with torch.optim.AdamW and compares. One test per backend: the thread mesh (unsharded, TP 1, 2,
# 4) and MPI at 2 and 4 ranks; each its own dump directory, so they can run side by side.
add_executable(transformers_dump ${CMAKE_CURRENT_LIST_DIR}/transformers_dump.cpp)
target_include_directories(transformers_dump PRIVATE ${CMAKE_CURRENT_LIST_DIR})
target_link_libraries(transformers_dump PRIVATE shardwise::eigen)
if(TARGET shardwise::mpi)
  target_link_libraries(transformers_dump PRIVATE shardwise::mpi)
else()
  target_compile_definitions(transformers_dump PRIVATE SHARDWISE_DUMP_WITHOUT_MPI)
endif()

set(transformers_tests torch.transformers_tied_parity.threads)
if(TARGET shardwise::mpi)
  list(APPEND transformers_tests torch.transformers_tied_parity.mpi2 torch.transformers_tied_parity.mpi4)
endif()

if(SHARDWISE_PYTHON)
  set(reference ${CMAKE_CURRENT_LIST_DIR}/transformers_reference.py)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/transformers_tied_threads)
  add_test(NAME torch.transformers_tied_parity.threads
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${dir}' && '$<TARGET_FILE:transformers_dump>' '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' '${dir}' unsharded tp1 tp2 tp4")
  set_tests_properties(torch.transformers_tied_parity.threads PROPERTIES LABELS torch TIMEOUT 900
                       PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed")
  if(TARGET shardwise::mpi)
    string(JOIN " " preflags ${MPIEXEC_PREFLAGS})
    foreach(n IN ITEMS 2 4)
      set(dir ${CMAKE_CURRENT_BINARY_DIR}/transformers_tied_mpi${n})
      add_test(NAME torch.transformers_tied_parity.mpi${n}
               COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 ${SHARDWISE_MPI_ENV}
                       sh -c "rm -rf '${dir}' && '${MPIEXEC_EXECUTABLE}' ${MPIEXEC_NUMPROC_FLAG} ${n} ${preflags} '$<TARGET_FILE:transformers_dump>' --mpi '${dir}' && '${SHARDWISE_PYTHON}' '${reference}' '${dir}' mpi${n}")
      set_tests_properties(torch.transformers_tied_parity.mpi${n} PROPERTIES LABELS "torch;mpi" TIMEOUT 900
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
