# Pipeline training against torch.distributed.pipelining (included from tests/CMakeLists.txt): pipeline_dump
# (shardwise) trains the Llama model cut into 2 stages on 2 threads with GPipe and with 1F1B (4 microbatches, 5
# AdamW steps clipped over both stages) and writes the initial weights under transformers' names, the microbatches
# fed and the step losses and norms; pipeline_reference.py trains LlamaForCausalLM split into the same stages with
# ScheduleGPipe and Schedule1F1B on 2 gloo processes and compares.
add_executable(pipeline_dump ${CMAKE_CURRENT_LIST_DIR}/pipeline_dump.cpp)
target_include_directories(pipeline_dump PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/..)
target_link_libraries(pipeline_dump PRIVATE shardwise::eigen doctest::doctest)  # the case headers include doctest

if(SHARDWISE_PYTHON)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/pipeline_dump_output)
  add_test(NAME torch.pipelining_parity
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${dir}' && '$<TARGET_FILE:pipeline_dump>' '${dir}' && '${SHARDWISE_PYTHON}' '${CMAKE_CURRENT_LIST_DIR}/pipeline_reference.py' '${dir}'")
  set_tests_properties(torch.pipelining_parity PROPERTIES LABELS torch TIMEOUT 900
                       PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed" PROCESSORS 2)
else()
  # Not skipped silently: registered as a test that fails and says how to get PyTorch.
  add_test(NAME torch.pipelining_parity COMMAND ${CMAKE_COMMAND} -E echo
           "torch.pipelining_parity needs PyTorch and transformers: SHARDWISE_PYTHON is not set; run"
           "scripts/torch-venv.sh and configure with -DSHARDWISE_PYTHON=<its output>")
  set_tests_properties(torch.pipelining_parity PROPERTIES LABELS torch WILL_FAIL ON)
endif()
