// The owner of the compile-fail tests' precompiled header (cmake/ShardwiseCompileFail.cmake): nothing of its own.
