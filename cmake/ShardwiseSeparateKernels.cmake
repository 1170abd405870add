# The parts of shardwise that a program may compile once instead of in each of its files (docs/build-time.md).
# Each is a static library built from separate_<part>.cpp (next to this file) with the consumer's compiler and
# flags, so the package stays header-only and arch-independent; it defines SHARDWISE_SEPARATE_<PART> for the files
# that link it. Used by the build tree and by the installed package's config alike.

# shardwise_link_first(target scope library): links the static `library` whole and ahead of the objects of `target`
# (scope INTERFACE: of every target that links it). Of the copies of an inline template (Eigen's GEMM behind a
# product) the linker keeps the first it meets; a file built at -O0 would otherwise hand its unoptimised copy to the
# library's optimised code (shardwise's tests ran 40 times slower so).
function(shardwise_link_first target scope library)
  if(CMAKE_SYSTEM_NAME STREQUAL "Linux")  # GNU ld, gold and lld; the flag differs elsewhere
    target_link_options(${target} BEFORE ${scope}
                        "SHELL:-Wl,--whole-archive $<TARGET_FILE:${library}> -Wl,--no-whole-archive")
  endif()
endfunction()

# shardwise::separate_<part>, linking `dependency` (what its source and its users compile against).
function(shardwise_add_separate_part part dependency)
  string(TOUPPER ${part} upper)
  add_library(shardwise_separate_${part} STATIC EXCLUDE_FROM_ALL  # built only when something links it
              "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/separate_${part}.cpp")
  add_library(shardwise::separate_${part} ALIAS shardwise_separate_${part})
  set_target_properties(shardwise_separate_${part} PROPERTIES POSITION_INDEPENDENT_CODE ON)  # shared libraries too
  target_link_libraries(shardwise_separate_${part} PUBLIC ${dependency})
  target_compile_definitions(shardwise_separate_${part} INTERFACE SHARDWISE_SEPARATE_${upper})
  shardwise_link_first(shardwise_separate_${part} INTERFACE shardwise_separate_${part})
endfunction()

# shardwise::separate_kernels: the nn kernels for float and double. eigen_target: the Eigen target the kernels and
# their users compile against (with BLAS where there is one).
function(shardwise_add_separate_kernels eigen_target)
  shardwise_add_separate_part(kernels ${eigen_target})
endfunction()

# shardwise::separate_runtime: sw::launch's RuntimeComm's MPI side, and both backends' collectives for float and
# double, so that a file which launches parses no MPI header and does not compile the backends' algorithms itself. mpi_target: shardwise's MPI target.
function(shardwise_add_separate_runtime mpi_target)
  shardwise_add_separate_part(runtime ${mpi_target})
  if(TARGET Eigen3::Eigen)  # its 16-bit floating types' transfers too (FSDP's mixed precision)
    target_link_libraries(shardwise_separate_runtime PRIVATE Eigen3::Eigen)
  endif()
endfunction()

# shardwise::separate_checkpoint: checkpoint IO's entry points (checkpoint/compiled_once.hpp), so that a file which
# saves or loads compiles only the calls, not the sharded save and load, safetensors, JSON and the Hugging Face
# mappings behind them. checkpoint_target: shardwise's checkpoint target; eigen_target: its Eigen target.
function(shardwise_add_separate_checkpoint checkpoint_target eigen_target)
  shardwise_add_separate_part(checkpoint ${checkpoint_target})
  target_link_libraries(shardwise_separate_checkpoint PUBLIC ${eigen_target})
endfunction()

# shardwise_link_separate_runtime_and_checkpoint(target): links `target` to shardwise::separate_runtime where it
# already links shardwise::mpi, and to shardwise::separate_checkpoint where it links shardwise::checkpoint (the
# project's own benchmarks and outside-check programs, as a user's build would).
function(shardwise_link_separate_runtime_and_checkpoint target)
  get_target_property(links ${target} LINK_LIBRARIES)
  if("shardwise::mpi" IN_LIST links AND TARGET shardwise::separate_runtime)
    target_link_libraries(${target} PRIVATE shardwise::separate_runtime)
  endif()
  if("shardwise::checkpoint" IN_LIST links AND TARGET shardwise::separate_checkpoint)
    target_link_libraries(${target} PRIVATE shardwise::separate_checkpoint)
  endif()
endfunction()
