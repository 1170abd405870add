# The parts of shardwise that a program may compile once instead of in each of its files (docs/build-time.md).
#
# shardwise::separate_kernels: the nn kernels compiled once, in a static library built from
# separate_kernels.cpp (next to this file) with the consumer's compiler and flags, so the package stays
# header-only and arch-independent. Used by the build tree and by the installed package's config alike.
# eigen_target: the Eigen target the kernels and their users compile against (with BLAS where there is one).
function(shardwise_add_separate_kernels eigen_target)
  add_library(shardwise_separate_kernels STATIC EXCLUDE_FROM_ALL  # built only when something links it
              "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/separate_kernels.cpp")
  add_library(shardwise::separate_kernels ALIAS shardwise_separate_kernels)
  set_target_properties(shardwise_separate_kernels PROPERTIES POSITION_INDEPENDENT_CODE ON)  # shared libraries too
  target_link_libraries(shardwise_separate_kernels PUBLIC ${eigen_target})
  target_compile_definitions(shardwise_separate_kernels INTERFACE SHARDWISE_SEPARATE_KERNELS)
endfunction()

# shardwise::separate_runtime (docs/build-time.md): sw::launch's RuntimeComm split, barrier and collectives for
# float and double compiled once, in a static library built from separate_runtime.cpp (next to this file), so
# that a file which launches does not compile both backends' algorithms itself. mpi_target: shardwise's MPI target.
function(shardwise_add_separate_runtime mpi_target)
  add_library(shardwise_separate_runtime STATIC EXCLUDE_FROM_ALL  # built only when something links it
              "${CMAKE_CURRENT_FUNCTION_LIST_DIR}/separate_runtime.cpp")
  add_library(shardwise::separate_runtime ALIAS shardwise_separate_runtime)
  set_target_properties(shardwise_separate_runtime PROPERTIES POSITION_INDEPENDENT_CODE ON)  # shared libraries too
  target_link_libraries(shardwise_separate_runtime PUBLIC ${mpi_target})
  target_compile_definitions(shardwise_separate_runtime INTERFACE SHARDWISE_SEPARATE_RUNTIME)
endfunction()
