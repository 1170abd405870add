# FSDP against PyTorch's FSDP2 (included from tests/CMakeLists.txt): fsdp_dump (shardwise) trains the Llama model
# under sw::fully_shard (full_shard, each block its own unit) at dp 2 on 2 threads for 5 AdamW steps clipped
# below every step's norm, and writes the initial weights under transformers' names, each rank's sequences, the
# per-rank losses, the global norms and the trained parameters; fsdp_reference.py trains LlamaForCausalLM under
# torch.distributed.fsdp.fully_shard (each decoder layer, then the root) on 2 gloo processes and compares. The
# sharded checkpoint fsdp_dump saves, consolidated by `shardwise consolidate`, must load in transformers.
add_executable(fsdp_dump ${CMAKE_CURRENT_LIST_DIR}/fsdp_dump.cpp)
target_include_directories(fsdp_dump PRIVATE ${CMAKE_CURRENT_LIST_DIR} ${CMAKE_CURRENT_LIST_DIR}/..)
target_link_libraries(fsdp_dump PRIVATE shardwise::eigen doctest::doctest)  # the case headers include doctest

if(SHARDWISE_PYTHON)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/fsdp_dump_output)
  # The sharded checkpoint is consolidated by the shardwise command when it is built (tools/ defines it after the
  # tests); without it the Python side finds no consolidated file and fails that check.
  set(consolidate "true")
  if(SHARDWISE_BUILD_TOOLS AND CLI11_FOUND)
    set(consolidate "'$<TARGET_FILE:shardwise_cli>' consolidate '${dir}/checkpoint' '${dir}/hf' --names transformers-llama --remove-checkpoint-dir")
  endif()
  add_test(NAME torch.fsdp_parity
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${dir}' && '$<TARGET_FILE:fsdp_dump>' '${dir}' && ${consolidate} && '${SHARDWISE_PYTHON}' '${CMAKE_CURRENT_LIST_DIR}/fsdp_reference.py' '${dir}'")
  set_tests_properties(torch.fsdp_parity PROPERTIES LABELS torch TIMEOUT 900
                       PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed" PROCESSORS 2)
else()
  # Not skipped silently: registered as a test that fails and says how to get PyTorch.
  add_test(NAME torch.fsdp_parity COMMAND ${CMAKE_COMMAND} -E echo
           "torch.fsdp_parity needs PyTorch and transformers: SHARDWISE_PYTHON is not set; run"
           "scripts/torch-venv.sh and configure with -DSHARDWISE_PYTHON=<its output>")
  set_tests_properties(torch.fsdp_parity PROPERTIES LABELS torch WILL_FAIL ON)
  set_target_properties(fsdp_dump PROPERTIES EXCLUDE_FROM_ALL ON)  # nothing would run it
endif()
