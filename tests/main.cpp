// doctest main for cf_tests. CUDA test cases ("cuda: ...") carry doctest's skip
// decorator when no GPU is visible; CTest runs one case per process, so there a
// skipped CUDA case exits 77 (SKIP_RETURN_CODE in tests/CMakeLists.txt) and is
// reported as skipped instead of passing without running.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstring>
#include <iostream>
#include <string>

#include "core/cuda.h"

namespace {
// Counts the test cases that ran: a --test-case filter that matches none is an
// error (CTest once ran 13 cases as empty filters: names with ';' were split).
struct RunCounter : doctest::IReporter {
  static int& started() {
    static int n = 0;
    return n;
  }
  explicit RunCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++started(); }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("run_counter", 1, RunCounter);
}  // namespace

int main(int argc, char** argv) {
  const bool gpu = cf::cuda::is_available();
  for (int i = 1; i < argc; ++i) {
    const char* prefix = "--test-case=cuda: ";
    if (!gpu && std::strncmp(argv[i], prefix, std::strlen(prefix)) == 0) {
      std::cout << "SKIPPED: " << (argv[i] + std::strlen("--test-case=")) << " (no CUDA device visible"
                << (cf::cuda_built() ? "" : "; this build has no CUDA backend") << ")\n";
      return 77;
    }
  }
  doctest::Context ctx(argc, argv);
  // Listing (CTest's test discovery) includes the skipped CUDA cases, so CTest
  // knows them by name and reports each one as skipped.
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--list-test-cases") == 0 || std::strcmp(argv[i], "-ltc") == 0)
      ctx.setOption("no-skip", true);
  const int rc = ctx.run();
  bool filtered = false, listing = false;
  for (int i = 1; i < argc; ++i) {
    filtered = filtered || std::strncmp(argv[i], "--test-case=", 12) == 0 || std::strncmp(argv[i], "-tc=", 4) == 0;
    listing = listing || std::strncmp(argv[i], "--list", 6) == 0 || std::strncmp(argv[i], "-l", 2) == 0 ||
              std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0 ||
              std::strcmp(argv[i], "--version") == 0 || std::strcmp(argv[i], "-v") == 0 ||
              std::strcmp(argv[i], "--count") == 0 || std::strcmp(argv[i], "-c") == 0;
  }
  if (rc == 0 && filtered && !listing && RunCounter::started() == 0) {
    std::cout << "cf_tests: the test case filter matched no test case\n";
    return 1;
  }
  if (!gpu && !ctx.shouldExit())
    std::cout << "cf_tests: the \"cuda: ...\" test cases were skipped (no CUDA device visible"
              << (cf::cuda_built() ? "" : "; this build has no CUDA backend") << ")\n";
  return rc;
}
