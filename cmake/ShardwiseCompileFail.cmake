# A compile-fail test passes only if the bad twin fails to build AND the output contains the library's own
# message; the good twin (same file, without SHARDWISE_SHOULD_FAIL) must build, so the file itself is sound.
function(shardwise_add_compile_fail_test name)
  if(NOT SHARDWISE_BUILD_COMPILE_CHECKS)
    return()
  endif()
  cmake_parse_arguments(A "" "SOURCE" "EXPECT;LINK" ${ARGN})
  add_library(cf_${name}_ok OBJECT ${A_SOURCE})
  add_library(cf_${name}_ko OBJECT EXCLUDE_FROM_ALL ${A_SOURCE})
  target_compile_definitions(cf_${name}_ko PRIVATE SHARDWISE_SHOULD_FAIL)
  target_link_libraries(cf_${name}_ok PRIVATE shardwise::shardwise ${A_LINK})
  target_link_libraries(cf_${name}_ko PRIVATE shardwise::shardwise ${A_LINK})
  string(REPLACE ";" "|||" expect "${A_EXPECT}")  # a list does not survive add_test's arguments whole
  add_test(NAME compile_fail.${name}
           COMMAND ${CMAKE_COMMAND} -DBUILD_DIR=${CMAKE_BINARY_DIR} -DTARGET=cf_${name}_ko -DCONFIG=$<CONFIG>
                   "-DEXPECT=${expect}" -P ${PROJECT_SOURCE_DIR}/cmake/expect_compile_fail.cmake)
  set_tests_properties(compile_fail.${name} PROPERTIES RESOURCE_LOCK shardwise_build_tree LABELS compile_fail)
endfunction()
