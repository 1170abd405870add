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
target_link_libraries(shardwise_header_check PRIVATE shardwise::checkpoint)

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

# The header parser under libFuzzer for 20 s, when clang with libFuzzer is at hand (scripts/fuzz.sh builds it in
# its own folder with clang, ASan and UBSan; run it longer by hand: scripts/fuzz.sh 600).
find_program(SHARDWISE_FUZZ_CXX NAMES clang++-14 clang++)
if(SHARDWISE_FUZZ_CXX AND EXISTS ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh)
  add_test(NAME fuzz.safetensors_header
           COMMAND ${CMAKE_COMMAND} -E env SHARDWISE_FUZZ_CXX=${SHARDWISE_FUZZ_CXX}
                   bash ${PROJECT_SOURCE_DIR}/scripts/fuzz.sh 20 ${CMAKE_BINARY_DIR}/fuzz)
  # libFuzzer prints "Done N runs" only when the time is up without a finding.
  set_tests_properties(fuzz.safetensors_header PROPERTIES LABELS fuzz TIMEOUT 600 PASS_REGULAR_EXPRESSION
                                                          "Done [0-9]+ runs")
endif()

# Sharded save and load of the Llama model on the thread mesh, resharding, bad checkpoints, a killed save.
shardwise_add_test(test_checkpoint_sharded test_checkpoint_sharded.cpp LINK shardwise::checkpoint shardwise::eigen)
