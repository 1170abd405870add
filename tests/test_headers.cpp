// The owner of the test binaries' precompiled header (tests/CMakeLists.txt, SHARDWISE_TEST_PCH): nothing of its own.
