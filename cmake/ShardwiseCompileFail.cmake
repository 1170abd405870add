# Compile checks need the compiler's verdict, not code: their targets compile with -fsyntax-only.
function(shardwise_syntax_only)
  set_target_properties(${ARGN} PROPERTIES CXX_COMPILER_LAUNCHER "sh;${PROJECT_SOURCE_DIR}/cmake/syntax_only.sh")
endfunction()

# The compile checks see the compiled-once parts (the kernels, the runtime, checkpoint IO) as a program linking
# their libraries does: declarations only. Their bodies are no template's checks, and g++ instantiates what they
# use at the end of every file, a precompiled header's too: the bad twin colwise_into_colwise took 4.4-4.9 s with
# the bodies precompiled and 0.75 s with declarations (g++ 12, -fsyntax-only). Each body is still compiled: in
# its library and in its own header's check.
# shardwise_declarations_of(out text): the macros that hide each part's bodies, but for the parts whose bodies
# `text` (a header's) holds; the header check gives each header its own, the compile-fail tests hide all.
function(shardwise_declarations_of out text)
  set(macros)
  foreach(part IN ITEMS KERNELS RUNTIME CHECKPOINT)
    if(NOT text MATCHES "SHARDWISE_SEPARATE_${part}|SHARDWISE_DETAIL_${part}_BODIES")
      list(APPEND macros SHARDWISE_SEPARATE_${part})
    endif()
  endforeach()
  set(${out} "${macros}" PARENT_SCOPE)
endfunction()
function(shardwise_declarations_only target)
  shardwise_declarations_of(macros "")
  target_compile_definitions(${target} PRIVATE ${macros})
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

# The bad twins compile at test time, one compiler run per test, and most of each run is the library's headers
# (g++ 12: 1.5 s a file, 0.5 s with them precompiled). They share one precompiled header of what most include;
# a twin that uses MPI, whose flags differ, compiles without it. The header only adds declarations a twin
# does not name, so each verdict and message stays the file's own (the good twins' shared unit shows the same).
function(shardwise_use_compile_fail_headers target link)
  if("shardwise::mpi" IN_LIST link OR NOT SHARDWISE_COMPILE_FAIL_PCH OR NOT TARGET shardwise::eigen)
    return()
  endif()
  set(adapters shardwise::eigen)
  if(TARGET shardwise::xtensor)
    list(APPEND adapters shardwise::xtensor)
  endif()
  if(NOT TARGET cf_headers)
    add_library(cf_headers OBJECT ${PROJECT_SOURCE_DIR}/cmake/compile_fail_headers.cpp)
    target_link_libraries(cf_headers PRIVATE shardwise::shardwise ${adapters})
    shardwise_declarations_only(cf_headers)
    target_precompile_headers(cf_headers PRIVATE <shardwise/shardwise.hpp> <shardwise/nn.hpp> <shardwise/fsdp.hpp>
                              <shardwise/models/llama.hpp> <shardwise/adapters/eigen.hpp>)
  endif()
  target_link_libraries(${target} PRIVATE ${adapters})  # the precompiled header's own flags
  target_precompile_headers(${target} REUSE_FROM cf_headers)
endfunction()

# A compile-fail test passes only if the bad twin fails to compile AND the output contains the library's own
# message; the good twin (same file, without SHARDWISE_SHOULD_FAIL) must compile, so the file itself is sound.
# The good twins are compiled together (shardwise_add_compile_fail_twins), each alone only where it must be.
function(shardwise_add_compile_fail_test name)
  if(NOT SHARDWISE_BUILD_COMPILE_CHECKS)
    return()
  endif()
  cmake_parse_arguments(A "" "SOURCE" "EXPECT;LINK" ${ARGN})
  if(SHARDWISE_BUILD_COMPILE_FAIL_TWINS)
    get_filename_component(source ${A_SOURCE} ABSOLUTE)
    set_property(GLOBAL APPEND PROPERTY shardwise_good_twins ${name} ${source})
    set_property(GLOBAL APPEND PROPERTY shardwise_good_twins_link ${A_LINK})
  endif()
  add_library(cf_${name}_ko OBJECT EXCLUDE_FROM_ALL ${A_SOURCE})
  target_compile_definitions(cf_${name}_ko PRIVATE SHARDWISE_SHOULD_FAIL)
  shardwise_declarations_only(cf_${name}_ko)
  target_link_libraries(cf_${name}_ko PRIVATE shardwise::shardwise ${A_LINK})  # never built: the test runs its command
  shardwise_use_compile_fail_headers(cf_${name}_ko "${A_LINK}")
  shardwise_expect_as_printed(expect ${A_EXPECT})
  string(REPLACE ";" "|||" expect "${expect}")  # a list does not survive add_test's arguments whole
  add_test(NAME compile_fail.${name}
           COMMAND ${CMAKE_COMMAND} -DCOMMANDS=${CMAKE_BINARY_DIR}/compile_commands.json -DTARGET=cf_${name}_ko
                   "-DEXPECT=${expect}" -P ${PROJECT_SOURCE_DIR}/cmake/expect_compile_fail.cmake)
  set_tests_properties(compile_fail.${name} PROPERTIES LABELS compile_fail)
endfunction()

# The good twins, once every compile-fail test is declared: one translation unit holding each file in a namespace
# of its own (cf_<name>), after every header any of them includes (so each file's own includes, already seen, add
# nothing inside its namespace). A file that specializes or instantiates a shardwise template, or defines main,
# cannot sit in a namespace: it compiles alone (cf_<name>_ok). An error in the shared unit names the twin's file.
function(shardwise_add_compile_fail_twins)
  get_property(twins GLOBAL PROPERTY shardwise_good_twins)
  get_property(link GLOBAL PROPERTY shardwise_good_twins_link)
  if(NOT twins)
    return()
  endif()
  list(REMOVE_DUPLICATES link)
  set(includes)
  set(bodies)
  while(twins)
    list(POP_FRONT twins name source)
    file(READ ${source} text)
    if(text MATCHES "(struct|class) (shardwise|sw)::|namespace shardwise|int main\\(")
      add_library(cf_${name}_ok OBJECT ${source})
      target_link_libraries(cf_${name}_ok PRIVATE shardwise::shardwise ${link})
      shardwise_declarations_only(cf_${name}_ok)
      shardwise_syntax_only(cf_${name}_ok)
      continue()
    endif()
    get_filename_component(folder ${source} DIRECTORY)
    string(REGEX MATCHALL "#include [<\"][^>\"]+[>\"]" lines "${text}")
    foreach(line IN LISTS lines)
      if(line MATCHES "\"(.+)\"")  # a quoted include, as seen from the twin's folder
        get_filename_component(header ${CMAKE_MATCH_1} ABSOLUTE BASE_DIR ${folder})
        set(line "#include \"${header}\"")
      endif()
      list(APPEND includes "${line}")
    endforeach()
    string(APPEND bodies "namespace cf_${name} {\n#include \"${source}\"\n}  // namespace cf_${name}\n")
  endwhile()
  list(REMOVE_DUPLICATES includes)
  list(JOIN includes "\n" includes)
  set(unit ${CMAKE_CURRENT_BINARY_DIR}/compile_fail_good_twins.cpp)
  file(CONFIGURE OUTPUT ${unit} CONTENT "// Generated: every compile-fail test's good twin (tests/compile_fail), in one unit.\n${includes}\n${bodies}")
  add_library(cf_good_twins OBJECT ${unit})
  target_link_libraries(cf_good_twins PRIVATE shardwise::shardwise ${link})
  shardwise_declarations_only(cf_good_twins)
  shardwise_syntax_only(cf_good_twins)
endfunction()
