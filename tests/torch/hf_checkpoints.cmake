# Hugging Face save_pretrained folders loaded by shardwise (included from tests/checkpoint.cmake, so only with
# the checkpoint headers): hf_checkpoints.py saves a random transformers.LlamaForCausalLM as one
# model.safetensors and as shards with model.safetensors.index.json, with its logits and transformers'
# non-strict load report, and a tied LlamaForCausalLM and a GPT2LMHeadModel (one file, and shards) with their
# logits; hf_checkpoint_load loads every folder with sw::load_pretrained at TP 1, 2 and 4 on threads and compares.
# moe_checkpoints.py and hf_checkpoint_load --moe do the same for mixtures of experts (torch.moe_checkpoints_parity).
add_executable(hf_checkpoint_load ${CMAKE_CURRENT_LIST_DIR}/hf_checkpoint_load.cpp)
target_link_libraries(hf_checkpoint_load PRIVATE shardwise::checkpoint shardwise::eigen)
if(SHARDWISE_PYTHON)
  set(hf_checkpoints_dir ${CMAKE_CURRENT_BINARY_DIR}/hf_checkpoints)
  add_test(NAME torch.hf_checkpoints_parity
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${hf_checkpoints_dir}' && '${SHARDWISE_PYTHON}' '${CMAKE_CURRENT_LIST_DIR}/hf_checkpoints.py' '${hf_checkpoints_dir}' && '$<TARGET_FILE:hf_checkpoint_load>' '${hf_checkpoints_dir}'")
  set_tests_properties(torch.hf_checkpoints_parity PROPERTIES LABELS torch TIMEOUT 600 PASS_REGULAR_EXPRESSION
                                                               "[1-9][0-9]* passed, 0 failed")
  # Mixtral, Qwen3-MoE and Qwen2-MoE save_pretrained folders (and Mixtral's fused experts) in fp64: logits, aux loss
  # and 5 AdamW steps against transformers at tp 1 and 2, then shardwise's export in from_pretrained.
  set(moe_dir ${CMAKE_CURRENT_BINARY_DIR}/moe_checkpoints)
  set(moe_script ${CMAKE_CURRENT_LIST_DIR}/moe_checkpoints.py)
  add_test(NAME torch.moe_checkpoints_parity
           COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                   sh -c "rm -rf '${moe_dir}' && mkdir -p '${moe_dir}' && '${SHARDWISE_PYTHON}' '${moe_script}' '${moe_dir}' prepare && '$<TARGET_FILE:hf_checkpoint_load>' --moe '${moe_dir}' && '${SHARDWISE_PYTHON}' '${moe_script}' '${moe_dir}' check")
  # Two programs print a summary each: any failure, in either, fails the test.
  set_tests_properties(torch.moe_checkpoints_parity PROPERTIES LABELS torch TIMEOUT 600 PASS_REGULAR_EXPRESSION
                       "[1-9][0-9]* passed, 0 failed" FAIL_REGULAR_EXPRESSION "FAIL|[1-9][0-9]* failed|Traceback")
else()  # not skipped silently, as the other comparisons with PyTorch (tests/CMakeLists.txt)
  add_test(NAME torch.hf_checkpoints_parity COMMAND ${CMAKE_COMMAND} -E echo
           "torch.hf_checkpoints_parity needs PyTorch: SHARDWISE_PYTHON is not set; run scripts/torch-venv.sh and"
           "configure with -DSHARDWISE_PYTHON=<its output>")
  set_tests_properties(torch.hf_checkpoints_parity PROPERTIES LABELS torch WILL_FAIL ON)
  add_test(NAME torch.moe_checkpoints_parity COMMAND ${CMAKE_COMMAND} -E echo
           "torch.moe_checkpoints_parity needs PyTorch: SHARDWISE_PYTHON is not set; run scripts/torch-venv.sh and"
           "configure with -DSHARDWISE_PYTHON=<its output>")
  set_tests_properties(torch.moe_checkpoints_parity PROPERTIES LABELS torch WILL_FAIL ON)
endif()
