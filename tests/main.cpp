// doctest's main in its own translation unit: each test file then compiles in seconds.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
