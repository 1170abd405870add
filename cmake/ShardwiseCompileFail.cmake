# Compile checks need the compiler's verdict, not code: their targets compile with -fsyntax-only.
function(shardwise_syntax_only)
  set_target_properties(${ARGN} PROPERTIES CXX_COMPILER_LAUNCHER "sh;${PROJECT_SOURCE_DIR}/cmake/syntax_only.sh")
endfunction()

# The EXPECT patterns are written as g++ prints types; other compilers print some differently. clang prints
# `Shard<1>>` where g++ prints `Shard<1> >`, and a fixed_string argument without its namespace; clang 14 prints
# it as numbers (`{{112, 112, 0}}`), so the library's diagnostics add the characters (`text<'p', 'p'>`), which
# the test then requires instead. A pattern's final `>` is dropped: g++ prints that defaulted argument too.
function(shardwise_expect_as_printed out)
  set(clang14 OFF)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 15)
    set(clang14 ON)
  endif()
  set(result)
  foreach(pattern IN LISTS ARGN)
    string(REPLACE " >" " ?>" pattern "${pattern}")
    string(REGEX REPLACE "( [?])?>$" "" pattern "${pattern}")  # g++ may print the defaulted text<...> after it
    while(clang14 AND pattern MATCHES "shardwise::fixed_string<[0-9]+>{\"([^\"]*)\"}")
      set(whole "${CMAKE_MATCH_0}")
      string(REGEX REPLACE "(.)" "'\\1', " chars "${CMAKE_MATCH_1}")  # pp -> 'p', 'p',
      string(REGEX REPLACE ", $" "" chars "${chars}")
      string(REPLACE "." "[.]" chars "${chars}")
      string(REPLACE "*" "[*]" chars "${chars}")
      string(REPLACE "${whole}" "{{[0-9, .]+}}" pattern "${pattern}")  # long ones end in "..."
      list(APPEND result "text<${chars}>")
    endwhile()
    if(clang14)  # it prints the quotes inside a static_assert message escaped
      string(REPLACE "\"" "\\\\?\"" pattern "${pattern}")
    endif()
    string(REPLACE "shardwise::fixed_string<" "(shardwise::)?fixed_string<" pattern "${pattern}")
    list(APPEND result "${pattern}")
  endforeach()
  set(${out} "${result}" PARENT_SCOPE)
endfunction()

# A compile-fail test passes only if the bad twin fails to compile AND the output contains the library's own
# message; the good twin (same file, without SHARDWISE_SHOULD_FAIL) must compile, so the file itself is sound.
function(shardwise_add_compile_fail_test name)
  if(NOT SHARDWISE_BUILD_COMPILE_CHECKS)
    return()
  endif()
  cmake_parse_arguments(A "" "SOURCE" "EXPECT;LINK" ${ARGN})
  if(SHARDWISE_BUILD_COMPILE_FAIL_TWINS)
    add_library(cf_${name}_ok OBJECT ${A_SOURCE})
    target_link_libraries(cf_${name}_ok PRIVATE shardwise::shardwise ${A_LINK})
    shardwise_syntax_only(cf_${name}_ok)
  endif()
  add_library(cf_${name}_ko OBJECT EXCLUDE_FROM_ALL ${A_SOURCE})
  target_compile_definitions(cf_${name}_ko PRIVATE SHARDWISE_SHOULD_FAIL)
  target_link_libraries(cf_${name}_ko PRIVATE shardwise::shardwise ${A_LINK})  # never built: the test runs its command
  shardwise_expect_as_printed(expect ${A_EXPECT})
  string(REPLACE ";" "|||" expect "${expect}")  # a list does not survive add_test's arguments whole
  add_test(NAME compile_fail.${name}
           COMMAND ${CMAKE_COMMAND} -DCOMMANDS=${CMAKE_BINARY_DIR}/compile_commands.json -DTARGET=cf_${name}_ko
                   "-DEXPECT=${expect}" -P ${PROJECT_SOURCE_DIR}/cmake/expect_compile_fail.cmake)
  set_tests_properties(compile_fail.${name} PROPERTIES LABELS compile_fail)
endfunction()
