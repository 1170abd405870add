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
