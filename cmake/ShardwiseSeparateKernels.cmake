# shardwise::separate_kernels (docs/build-time.md): the nn kernels compiled once, in a static library built from
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
