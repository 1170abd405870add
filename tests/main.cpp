// doctest's main in its own translation unit: each test file then compiles in seconds. A run whose filters match
// no test case fails: CTest runs each file of a test group's binary by its --source-file, and a misspelled or
// moved file must not pass on zero cases.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <iostream>

namespace {

int cases_started = 0;

/// Counts the test cases that ran; reports nothing.
struct count_cases : doctest::IReporter {
  explicit count_cases(doctest::ContextOptions const&) {}
  void report_query(doctest::QueryData const&) override {}
  void test_run_start() override {}
  void test_run_end(doctest::TestRunStats const&) override {}
  void test_case_start(doctest::TestCaseData const&) override { ++cases_started; }
  void test_case_reenter(doctest::TestCaseData const&) override {}
  void test_case_end(doctest::CurrentTestCaseStats const&) override {}
  void test_case_exception(doctest::TestCaseException const&) override {}
  void subcase_start(doctest::SubcaseSignature const&) override {}
  void subcase_end() override {}
  void log_assert(doctest::AssertData const&) override {}
  void log_message(doctest::MessageData const&) override {}
  void test_case_skipped(doctest::TestCaseData const&) override {}
};

}  // namespace

DOCTEST_REGISTER_LISTENER("count_cases", 1, count_cases);

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int const result = context.run();
  if (context.shouldExit()) return result;  // --help, --list-test-cases and the like
  if (result == 0 && cases_started == 0) {
    std::cerr
        << "no test case matched the filters given: check the file name in --source-file (tests/CMakeLists.txt)\n";
    return 1;
  }
  return result;
}
