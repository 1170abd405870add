# Checkpoints: safetensors, sharded save and load. Included from tests/CMakeLists.txt when present.
if(NOT TARGET shardwise::checkpoint)
  # Without nlohmann::json the checkpoint headers cannot compile: keep them out of the header check, and say why.
  message(STATUS "shardwise: nlohmann_json not found, checkpoint tests skipped (apt-get install nlohmann-json3-dev)")
  foreach(source IN LISTS header_sources)
    if(source MATCHES "shardwise_checkpoint_")
      set_source_files_properties(${source} PROPERTIES HEADER_FILE_ONLY ON)
    endif()
  endforeach()
  return()
endif()

# Every public checkpoint header compiles alone (the header check above globs them; they need nlohmann::json).
if(TARGET shardwise_header_check)
  target_link_libraries(shardwise_header_check PRIVATE shardwise::checkpoint)
endif()

shardwise_add_test(test_safetensors test_safetensors.cpp LINK shardwise::checkpoint shardwise::eigen)

# Outside check with Hugging Face's own safetensors: files it writes (numpy API; torch API for BF16) load here,
# and files written here load there, every dtype and the metadata.
add_executable(safetensors_check torch/safetensors_check.cpp)
target_link_libraries(safetensors_check PRIVATE shardwise::checkpoint)
if(SHARDWISE_PYTHON)
  set(safetensors_dir ${CMAKE_CURRENT_BINARY_DIR}/safetensors_parity)
  add_test(NAME torch.safetensors_parity
           COMMAND sh -c "rm -rf '${safetensors_dir}' && '${SHARDWISE_PYTHON}' '${CMAKE_CURRENT_SOURCE_DIR}/torch/safetensors_reference.py' '$<TARGET_FILE:safetensors_check>' '${safetensors_dir}'")
  set_tests_properties(torch.safetensors_parity PROPERTIES LABELS torch TIMEOUT 300 PASS_REGULAR_EXPRESSION
                                                            "[1-9][0-9]* passed, 0 failed")
endif()

# Every reader of outside input under libFuzzer, 8 s each, when clang with libFuzzer is at hand (scripts/fuzz.sh
# builds the targets in their own folder with clang, ASan and UBSan; run them longer by hand: scripts/fuzz.sh 600).
find_program(SHARDWISE_FUZZ_CXX NAMES clang++-14 clang++)
if(SHARDWISE_FUZZ_CXX AND EXISTS ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh)
  add_test(NAME fuzz.readers
           COMMAND ${CMAKE_COMMAND} -E env SHARDWISE_FUZZ_CXX=${SHARDWISE_FUZZ_CXX}
                   bash ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh 8 ${CMAKE_BINARY_DIR}/fuzz)
  # The script's last line comes only after every target ran its time without a finding.
  set_tests_properties(fuzz.readers PROPERTIES LABELS fuzz TIMEOUT 900 PASS_REGULAR_EXPRESSION
                                               "every target ran its time without a finding" COST 90)  # started first
endif()

# Sharded save and load of the Llama model on the thread mesh, resharding, bad checkpoints, a killed save.
shardwise_add_test(test_checkpoint_sharded test_checkpoint_sharded.cpp LINK shardwise::checkpoint shardwise::eigen)
shardwise_add_test(test_checkpoint_concurrency test_checkpoint_concurrency.cpp LINK shardwise::checkpoint shardwise::eigen)
# Asynchronous saves (sw::async_save): round trips, a training step while the write is in flight, failures raised
# at the next call on every rank, a save killed in the background; on MPI below.
shardwise_add_test_group(test_checkpoint_async THREADS test_checkpoint_async.cpp MPI test_checkpoint_async_mpi.cpp
                         RANKS 2 4 LINK shardwise::checkpoint shardwise::eigen)

# Consolidation into one safetensors file, and the `shardwise` command (tools/).
shardwise_add_test(test_checkpoint_consolidate test_checkpoint_consolidate.cpp LINK shardwise::checkpoint shardwise::eigen)
shardwise_add_test(test_checkpoint_pipeline test_checkpoint_pipeline.cpp LINK shardwise::checkpoint shardwise::eigen)
# The planner (config.json reading, memory and step-time estimates, the search) behind `shardwise plan`.
shardwise_add_test(test_planner test_planner.cpp LINK shardwise::checkpoint shardwise::eigen)
target_compile_definitions(test_planner PRIVATE SHARDWISE_TEST_DATA_DIR="${CMAKE_CURRENT_SOURCE_DIR}/data"
                                                SHARDWISE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
find_package(CLI11 CONFIG QUIET)
if(SHARDWISE_BUILD_TOOLS AND CLI11_FOUND)  # tools/ defines shardwise_cli after the tests
  # shardwise plan: Llama 3 70B over 1,024 and 16,384 ranks; no layout fitting (exit code 1, the smallest
  # need named); a config that is not JSON (exit code 1, the file and the parser's position named).
  set(plan_70b "'$<TARGET_FILE:shardwise_cli>' plan '${CMAKE_CURRENT_SOURCE_DIR}/data/llama3_70b_config.json'")
  foreach(ranks 1024 16384)
    add_test(NAME cli.plan.llama3_70b.${ranks} COMMAND sh -c "${plan_70b} --ranks ${ranks} --memory-per-rank 80GiB --sequence 8192; echo exit code $?")
    set_tests_properties(cli.plan.llama3_70b.${ranks} PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION
        "Llama, 70.55 B parameters.*${ranks} ranks, 80.0 GiB per rank.*machine: .*built in, as tools/machines/this_machine.json; measured 20[0-9-]+.*measure yours: .*bench_machine.*searched [0-9]+ layouts in [0-9.]+ ms; [1-9][0-9]* fit.*dp +pp +tp +cp +micro.*exit code 0")
  endforeach()
  # Qwen2, Mistral and GPT-2 configs: their family and what sets them apart in the first line.
  foreach(case IN ITEMS "qwen2_7b|4096|Qwen2, 7.62 B parameters .*q/k/v biases\\)" "mistral_7b|8192|Mistral, 7.24 B parameters .*sliding window 4096\\)"
                        "gpt2|1024|GPT-2, 0.12 B parameters .*no pipeline stages\\)")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 config)
    list(GET parts 1 sequence)
    list(GET parts 2 expected)
    add_test(NAME cli.plan.${config}
             COMMAND sh -c "'$<TARGET_FILE:shardwise_cli>' plan '${CMAKE_CURRENT_SOURCE_DIR}/data/${config}_config.json' --ranks 64 --memory-per-rank 80GiB --sequence ${sequence} --top 2; echo exit code $?")
    set_tests_properties(cli.plan.${config} PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "^${expected}.*fit.*exit code 0")
  endforeach()
  add_test(NAME cli.plan.no_fit COMMAND sh -c "${plan_70b} --ranks 8 --memory-per-rank 80GiB --sequence 8192 2>&1; echo exit code $?")
  set_tests_properties(cli.plan.no_fit PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION
      "no layout of 8 ranks fits in 80.0 GiB per rank; the smallest needs [0-9.]+ GiB \\(dp [0-9]+ x pp [0-9]+ x tp [0-9]+.*give more memory per rank, more ranks or a smaller --batch\n*exit code 1")
  add_test(NAME cli.plan.bad_json
           COMMAND sh -c "'$<TARGET_FILE:shardwise_cli>' plan '${CMAKE_CURRENT_SOURCE_DIR}/data/broken_config.json' --ranks 8 --memory-per-rank 80GiB --sequence 8192 2>&1; echo exit code $?")
  set_tests_properties(cli.plan.bad_json PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION
      "broken_config.json is not valid JSON \\(.*parse error at line 4.*exit code 1")
  # A machine file with a physically impossible rate: refused with the field, the value and the range (exit code 1),
  # instead of every layout planned at an infinite step and 0 tokens/s (a . for each ; of the message: CMake splits at them).
  add_test(NAME cli.plan.impossible_machine
           COMMAND sh -c "${plan_70b} --ranks 1024 --memory-per-rank 80GiB --sequence 8192 --machine '${CMAKE_CURRENT_SOURCE_DIR}/data/impossible_machine.json' 2>&1; echo exit code $?")
  set_tests_properties(cli.plan.impossible_machine PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION
      "\"gemm_flops\" in .*impossible_machine.json is 1e-300. a rank's GEMM rate must be a number from 1000 to 1e\\+18 FLOP/s. measure this machine with bench_machine.*\nexit code 1")
  # Counts out of range, on any flag: the flag, what it is for and the range, exit code non-zero (CLI11's 105),
  # at once (a huge --ranks or --batch used to search for minutes). One test runs every case in turn and fails
  # unless each prints its sentence.
  set(bad_flags "")
  foreach(case IN ITEMS "ranks 0|the ranks" "ranks 99999999999999999999999|the ranks" "batch 0|the sequences"
                        "batch 4294967296|the sequences" "sequence 0|the tokens per sequence" "top 0|how many layouts"
                        "tp 0|the tensor-parallel ranks" "cp 0|the context-parallel ranks"
                        "cp 9|the context-parallel ranks")
    string(REPLACE "|" ";" parts "${case}")
    list(GET parts 0 given)
    list(GET parts 1 meaning)
    string(REGEX REPLACE " .*" "" name "${given}")
    set(ranks_flag "--ranks 8")
    if(name STREQUAL "ranks")
      set(ranks_flag "")
    endif()
    set(sequence_flag "--sequence 8192")
    if(name STREQUAL "sequence")
      set(sequence_flag "")
    endif()
    string(APPEND bad_flags "${plan_70b} ${ranks_flag} ${sequence_flag} --memory-per-rank 80GiB --${given} 2>&1 | "
           "grep -q -- '--${name}: is .*; give ${meaning}.*, a whole number from ' || echo 'no sentence for --${given}'; ")
  endforeach()
  # --sequence is required (max_position_embeddings is no training length); --state takes the three kinds.
  string(APPEND bad_flags "${plan_70b} --ranks 8 --memory-per-rank 80GiB 2>&1 | grep -q -- '--sequence is required' "
         "|| echo 'no sentence for a missing --sequence'; ${plan_70b} --ranks 8 --memory-per-rank 80GiB --sequence 8 "
         "--state zero2 2>&1 | grep -q -- '--state: zero2 not in {replicated,zero1,fsdp}' || echo 'no sentence for --state zero2'; ")
  add_test(NAME cli.plan.bad_flags COMMAND sh -c "${bad_flags} echo checked")
  set_tests_properties(cli.plan.bad_flags PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "^checked\n$")
  # The outputs docs/planning.md quotes are what the commands print now (they drifted while nothing checked).
  add_test(NAME docs.outputs.planning
           COMMAND ${CMAKE_COMMAND} -DDOC=${PROJECT_SOURCE_DIR}/docs/planning.md -DSOURCE_DIR=${PROJECT_SOURCE_DIR}
                   -DSHARDWISE=$<TARGET_FILE:shardwise_cli> -P ${PROJECT_SOURCE_DIR}/cmake/check_doc_outputs.cmake)
  set_tests_properties(docs.outputs.planning PROPERTIES LABELS "docs;cli")
  foreach(command IN ITEMS "" consolidate inspect verify plan)
    add_test(NAME cli.help${command} COMMAND shardwise_cli ${command} --help)
    set_tests_properties(cli.help${command} PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "Usage:.*shardwise")
  endforeach()
  # A bad checkpoint: exit code 1 and the library's words (a pass regex alone would ignore the exit code).
  add_test(NAME cli.bad_checkpoint
           COMMAND sh -c "'$<TARGET_FILE:shardwise_cli>' consolidate '${CMAKE_CURRENT_BINARY_DIR}/no_such_checkpoint' '${CMAKE_CURRENT_BINARY_DIR}/no_output' 2>&1; echo exit code $?")
  set_tests_properties(cli.bad_checkpoint PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION
                                                     "holds no shardwise_checkpoint.json.*exit code 1")
  # verify and inspect on a damaged checkpoint (the doctest case is skipped in test_checkpoint_concurrency's own run).
  add_test(NAME cli.verify COMMAND test_checkpoint_concurrency --no-skip "--test-case=cli: *" --no-colors)
  set_target_properties(test_checkpoint_concurrency PROPERTIES EXCLUDE_FROM_ALL OFF)  # built with the tools
  set_tests_properties(cli.verify PROPERTIES LABELS cli ENVIRONMENT "SHARDWISE_CLI=$<TARGET_FILE:shardwise_cli>")
  # Consolidated from TP 4 and loaded by Hugging Face transformers' LlamaForCausalLM: the same logits.
  add_executable(safetensors_llama_checkpoint torch/safetensors_llama_checkpoint.cpp)
  target_link_libraries(safetensors_llama_checkpoint PRIVATE shardwise::checkpoint shardwise::eigen)
  if(SHARDWISE_PYTHON)
    set(consolidate_dir ${CMAKE_CURRENT_BINARY_DIR}/consolidate_parity)
    add_test(NAME torch.consolidate_transformers_parity
             COMMAND ${CMAKE_COMMAND} -E env OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
                     sh -c "rm -rf '${consolidate_dir}' && '${SHARDWISE_PYTHON}' '${CMAKE_CURRENT_SOURCE_DIR}/torch/safetensors_llama_reference.py' '$<TARGET_FILE:safetensors_llama_checkpoint>' '$<TARGET_FILE:shardwise_cli>' '${consolidate_dir}'")
    set_tests_properties(torch.consolidate_transformers_parity PROPERTIES LABELS torch TIMEOUT 600
                                                                       PASS_REGULAR_EXPRESSION "[1-9][0-9]* passed, 0 failed")
  endif()
endif()

# Checkpoints of full tensors from other programs (Hugging Face's save_pretrained): mappings that rename,
# transpose, split fused tensors and slice; strict errors and the non-strict report; sharded folders.
shardwise_add_test(test_checkpoint_hf test_checkpoint_hf.cpp LINK shardwise::checkpoint shardwise::eigen)
# ... and transformers' own save_pretrained folders (LlamaForCausalLM), loaded at TP 1, 2 and 4: the same logits.
include(${CMAKE_CURRENT_SOURCE_DIR}/torch/hf_checkpoints.cmake)
include(${CMAKE_CURRENT_SOURCE_DIR}/torch/generate_parity.cmake)  # sw::generate against transformers' generate

# The same on MPI: saved and loaded across processes, at 2 and 4 of them.
if(TARGET shardwise::mpi)
  shardwise_add_mpi_doctest(test_checkpoint_mpi test_checkpoint_mpi.cpp RANKS 2 4)
  target_link_libraries(test_checkpoint_mpi PRIVATE shardwise::checkpoint)
endif()

# Model and AdamW state (ZeRO-1 slices per dp rank) saved together; resuming equals the uninterrupted run.
shardwise_add_test(test_checkpoint_optimizer test_checkpoint_optimizer.cpp LINK shardwise::checkpoint shardwise::eigen)

# Compile-time checks of safetensors reading and writing: element types without a safetensors dtype.
shardwise_add_compile_fail_test(core_safetensors_read_dtype SOURCE compile_fail/core_safetensors_read_dtype.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::safetensors: the tensor's element type has no safetensors dtype; use double, float, float16, bfloat16, int64_t, int32_t, uint8_t or bool")
shardwise_add_compile_fail_test(core_safetensors_write_dtype SOURCE compile_fail/core_safetensors_write_dtype.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::safetensors_writer: the tensor's element type has no safetensors dtype; use double, float, float16, bfloat16, int64_t, int32_t, uint8_t or bool")
# The ZeRO-1 asynchronous save refuses a model under FSDP at compile time (it saves through its own overload).
shardwise_add_compile_fail_test(checkpoint_async_fsdp SOURCE compile_fail/checkpoint_async_fsdp.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::save_sharded\\(\\.\\.\\., async_save\\): a model under FSDP shards its optimizer state itself; call save_sharded\\(sharded, optimizer, \\[tp,\\] dir, step, saver\\)")
# And so does the dp x tp save with the optimizer (ZeRO-1 gathers its slices; FSDP saves its own).
shardwise_add_compile_fail_test(checkpoint_optimizer_fsdp SOURCE compile_fail/checkpoint_optimizer_fsdp.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::save_sharded\\(model, optimizer, tp, dp, \\.\\.\\.\\): a model under FSDP shards its optimizer state itself; call save_sharded\\(sharded, optimizer, \\[tp,\\] dir, step\\)")
# A pipeline stage under FSDP given to the FSDP saves, which have no pipeline axis.
shardwise_add_compile_fail_test(checkpoint_fsdp_stage SOURCE compile_fail/checkpoint_fsdp_stage.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::save_sharded: the model under FSDP is a pipeline stage, and the saves of a model under FSDP do not take the pipeline axis")
# The adapters of a model under hybrid sharding, which save_lora does not offer yet.
shardwise_add_compile_fail_test(save_lora_hybrid SOURCE compile_fail/save_lora_hybrid.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::save_lora: a model under hybrid sharding \\(fully_shard\\(model, dp, replicate\\)\\) is not offered yet")
# And a pipeline stage's save with the optimizer, and the dp x tp load with it.
shardwise_add_compile_fail_test(checkpoint_optimizer_stage_fsdp SOURCE compile_fail/checkpoint_optimizer_stage_fsdp.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::save_sharded\\(stage, optimizer, tp, pp, dp, \\.\\.\\.\\): a model under FSDP shards its optimizer state itself; call save_sharded\\(sharded, optimizer, \\[tp,\\] dir, step\\)")
shardwise_add_compile_fail_test(checkpoint_optimizer_load_fsdp SOURCE compile_fail/checkpoint_optimizer_load_fsdp.cpp
  LINK shardwise::checkpoint shardwise::eigen
  EXPECT "shardwise::load_sharded\\(model, optimizer, tp, dp, \\.\\.\\.\\): a model under FSDP shards its optimizer state itself; call load_sharded\\(sharded, optimizer, \\[tp,\\] dir\\)")
