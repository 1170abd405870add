# Fails when a docs page (docs/**/*.md, README.md) names a `sw::` entity — sw is the alias users write for
# shardwise — that include/shardwise does not declare: `sw::fully_shard`, `sw::Shard<0>`, `sw::nn::matrix`,
# `sw::cost::working_bytes`. For each qualified name the last component must be declared somewhere in
# include/shardwise (comments left out): as a struct, class, union, enum, enumerator, concept, namespace, alias,
# function, variable or data member, or a macro. It is a word match on declarations, not a compiler's lookup:
# `sw::Lazy` passes because some Lazy is declared, whatever namespace it is in; a misspelt or removed name fails.
# docs/history/ is exempt: its pages are records and quote names as they were when written.
# -D: SOURCE_DIR.
file(GLOB_RECURSE headers ${SOURCE_DIR}/include/shardwise/*.hpp)
set(declared "")
foreach(header IN LISTS headers)
  file(READ ${header} text)
  string(REGEX REPLACE "//[^\n]*" "" text "${text}")  # comments (and /// documentation) declare nothing
  # struct N, class N, using N, concept N, namespace N, enum [class] N, #define N
  string(REGEX MATCHALL "(struct|class|union|using|concept|namespace|enum|define)[ \t]+[A-Za-z_][A-Za-z0-9_]*" found
         "${text}")
  list(APPEND declared ${found})
  # functions and variables: a type (or a qualifier, `>`, `&`, `*`) then the name then `(`, `=`, `{` or `;`
  string(REGEX MATCHALL "[A-Za-z0-9_>&*][ \t\n]+[A-Za-z_][A-Za-z0-9_]*[ \t]*[({=;]" found "${text}")
  list(APPEND declared ${found})
  # names a declaring macro makes: SHARDWISE_ELEMENTWISE(silu) at the start of a line
  string(REGEX MATCHALL "\n[ \t]*SHARDWISE_[A-Z_]+\\([ \t]*[A-Za-z_][A-Za-z0-9_]*[ \t]*\\)" found "${text}")
  foreach(entry IN LISTS found)
    string(REGEX REPLACE ".*\\([ \t]*([A-Za-z_][A-Za-z0-9_]*)[ \t]*\\)" "\\1" entry "${entry}")
    list(APPEND declared "${entry}")
  endforeach()
  # operators and conversions are not named in docs; enumerators: the lists of enum bodies
  string(REGEX MATCHALL "enum[ \t]+(class[ \t]+)?[A-Za-z_][A-Za-z0-9_]*[^{;]*{[^}]*}" bodies "${text}")
  foreach(body IN LISTS bodies)
    string(REGEX REPLACE "^[^{]*{" "" body "${body}")
    string(REGEX MATCHALL "[A-Za-z_][A-Za-z0-9_]*" words "${body}")
    list(APPEND declared ${words})
  endforeach()
endforeach()
set(names "")
foreach(entry IN LISTS declared)
  string(REGEX MATCH "[A-Za-z_][A-Za-z0-9_]*[ \t]*[({=;]?$" name "${entry}")
  string(REGEX REPLACE "[ \t({=;]+$" "" name "${name}")
  list(APPEND names ${name})
endforeach()
list(REMOVE_DUPLICATES names)

file(GLOB_RECURSE pages ${SOURCE_DIR}/docs/*.md)
list(APPEND pages ${SOURCE_DIR}/README.md)
list(FILTER pages EXCLUDE REGEX "/docs/history/")
set(missing "")
set(checked 0)
foreach(page IN LISTS pages)
  file(READ ${page} text)
  string(REGEX REPLACE "[][;]" " " text "${text}")  # brackets and semicolons would split CMake's lists
  string(REGEX MATCHALL "(^|[^A-Za-z0-9_:])sw(::[A-Za-z_][A-Za-z0-9_]*)+" uses "${text}")
  foreach(use IN LISTS uses)
    string(REGEX MATCH "sw(::[A-Za-z_][A-Za-z0-9_]*)+" use "${use}")
    string(REGEX MATCH "[A-Za-z_][A-Za-z0-9_]*$" last "${use}")
    math(EXPR checked "${checked} + 1")
    list(FIND names "${last}" at)
    if(at EQUAL -1)
      file(RELATIVE_PATH where ${SOURCE_DIR} ${page})
      list(APPEND missing "${where}: ${use}")
    endif()
  endforeach()
endforeach()
if(missing)
  list(REMOVE_DUPLICATES missing)
  list(JOIN missing "\n  " missing)
  message(FATAL_ERROR "docs name sw:: entities that include/shardwise does not declare (rename them to what the "
                      "headers declare, or remove them):\n  ${missing}")
endif()
list(LENGTH pages page_count)
list(LENGTH names name_count)
message(STATUS "${checked} sw:: names in ${page_count} docs pages, each declared in include/shardwise "
               "(${name_count} declared names)")
