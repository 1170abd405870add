# cmake -DBUILD_DIR=<build tree> -DTARGET=<name> -DEXPECT=<pattern> -P expect_link_fail.cmake
# Builds TARGET (an EXCLUDE_FROM_ALL executable whose link must fail) and requires the failure and EXPECT in what
# the build printed: a link-time check's test, as compile-fail tests are for compile-time checks.
execute_process(COMMAND ${CMAKE_COMMAND} --build "${BUILD_DIR}" --target "${TARGET}"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(rc EQUAL 0)
  message(FATAL_ERROR "${TARGET} linked but must not:\n${out}")
endif()
if(NOT out MATCHES "${EXPECT}")
  message(FATAL_ERROR "${TARGET} failed, but not with /${EXPECT}/:\n${out}")
endif()
