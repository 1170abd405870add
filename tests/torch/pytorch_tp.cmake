# PyTorch's own tensor parallelism on the Llama model (included from tests/CMakeLists.txt): llama_dump (shardwise)
# writes the initial weights and its TP 2 + SP losses; llama_tp_reference.py shards transformers' LlamaForCausalLM
# with parallelize_module and torchtitan's Llama plan at TP 2 on gloo (2 spawned processes), trains 5 AdamW steps
# on the same batches and compares. Its own dump directory, so it can run beside torch.llama_transformers_parity.
if(SHARDWISE_PYTHON)
  set(llama_tp_dump_dir ${CMAKE_CURRENT_BINARY_DIR}/llama_tp_dump_output)
  add_test(NAME torch.llama_pytorch_tp_parity
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${llama_tp_dump_dir}' && '$<TARGET_FILE:llama_dump>' '${llama_tp_dump_dir}' && '${SHARDWISE_PYTHON}' '${CMAKE_CURRENT_LIST_DIR}/llama_tp_reference.py' '${llama_tp_dump_dir}'")
  set_tests_properties(torch.llama_pytorch_tp_parity PROPERTIES LABELS torch TIMEOUT 900 PASS_REGULAR_EXPRESSION
                                                                  "[1-9][0-9]* passed, 0 failed" PROCESSORS 2)
endif()
