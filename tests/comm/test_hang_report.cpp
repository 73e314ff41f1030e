// The collective watchdog in-process (run_ranks: each rank a thread): each scenario of
// hang_scenarios.h ends the process (exit 3) within the timeout plus 10 s, with a report
// naming the rank that is behind, its group and the operation. The same scenarios run under
// mpirun in mpi/test_watchdog_mpi.cpp.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "comm/hang_expectations.h"
#include "comm/hang_scenarios.h"
#include "comm/local_communicator.h"
#include "comm/watchdog.h"

namespace {

// Escapes a literal for the death test's POSIX extended regex.
std::string literal(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string("()[]{}.*+?^$|\\").find(c) != std::string::npos) out += '\\';
    out += c;
  }
  return out;
}

void run_scenario(const std::string& scenario) {
  omni::set_hang_report_seconds(1);
  omni::set_collective_timeout(3, "--distributed-timeout-minutes 0.05");
  omni::run_ranks(
      4, [&](omni::Communicator& world) { omni::testing::run_hang_scenario(world, scenario); });
  std::fprintf(stderr, "the watchdog did not end the job\n");
  std::_Exit(0);
}

class HangReport : public ::testing::TestWithParam<const char*> {};

TEST_P(HangReport, NamesTheRankGroupAndOperationInProcess) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const HangCase c = hang_case(GetParam(), "all_reduce", "send");
  const auto start = std::chrono::steady_clock::now();
  // The summary at the timeout, then the line that ends the job.
  EXPECT_EXIT(run_scenario(c.scenario), ::testing::ExitedWithCode(3),
              literal(c.report) + "[^\n]*" + literal(c.phase) +
                  "[^\n]*\n[^\n]*error: [^\n]*--distributed-timeout-minutes 0\\.05 \\(3\\.0 s\\)");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 3 + 10);
  std::printf("%s: the job ended after %.1f s (timeout 3 s)\n", c.scenario, seconds);
}

// Without a usable exchange directory there is no report, but the job still ends, 8 s
// after the timeout at most, with the line that names a waiting call (the first past it).
TEST(HangReportExchange, TheJobEndsEvenWhenTheDirectoryCannotBeWritten) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EXIT(
      {
        setenv("OMNITRON_HANG_DIR", "/nonexistent/omnitron-hang-test", 1);
        run_scenario("skip");
      },
      ::testing::ExitedWithCode(3),
      "error: (all_reduce on the dp|barrier on the world) group \\(its rank [0-9] of "
      "[24]\\) has waited [^\n]*--distributed-timeout-minutes 0\\.05");
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 3 + 10);
}

INSTANTIATE_TEST_SUITE_P(Scenarios, HangReport, ::testing::Values("skip", "stall", "data", "send"));

}  // namespace
