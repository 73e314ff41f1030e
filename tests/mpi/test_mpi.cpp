// Multi-rank runs under mpirun (oversubscribed: this machine may have fewer cores than
// ranks): the MPI check program at several sizes, and the ways a job must end when a rank
// fails. Every run is bounded by `timeout 60`, the limit for a failing job to end;
// a hang shows as exit status 124. Durations are printed, not asserted.
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "mpirun.h"

namespace {

const std::string kCheck = OMNITRON_MPI_CHECK;

class MpiCheck : public ::testing::TestWithParam<int> {};

TEST_P(MpiCheck, EveryCommunicatorCallGivesTheExpectedValues) {
  const int ranks = GetParam();
  const MpiRun r = mpirun(ranks, kCheck + " collectives");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("all checks passed on " + std::to_string(ranks) + " ranks"),
            std::string::npos)
      << r.output;
  std::printf("%d ranks: %.2f s including mpirun start\n", ranks, r.seconds);
}

INSTANTIATE_TEST_SUITE_P(Ranks, MpiCheck, ::testing::Values(2, 3, 4, 8));

TEST(MpiFailure, AThrowingRankEndsEveryRankWithItsMessage) {
  const MpiRun r = mpirun(4, kCheck + " throw 2");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job did not end within 60 s:\n" << r.output;
  EXPECT_NE(r.output.find("[rank 2 of 4]: error: rank 2 was told to fail"), std::string::npos)
      << r.output;
  std::printf("one of 4 ranks threw: the job ended after %.2f s (with mpirun start)\n",
              r.seconds);
}

TEST(MpiFailure, AKilledRankEndsTheJobWithMpirunsReport) {
  const std::string pidfile = (std::filesystem::temp_directory_path() /
                               ("omnitron_mpi_kill_" + std::to_string(getpid()))).string();
  std::filesystem::remove(pidfile);
  MpiRun r{};
  std::thread job([&] { r = mpirun(3, kCheck + " hang " + pidfile); });
  pid_t victim = 0;
  for (int i = 0; i < 600 && !victim; ++i) {  // rank 1 writes its pid once MPI is up
    std::ifstream(pidfile) >> victim;
    if (!victim) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(victim, 0) << "rank 1 never wrote its pid";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // well inside the all-reduces
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  job.join();
  const double after_kill =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  std::filesystem::remove(pidfile);
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job did not end within 60 s:\n" << r.output;
  EXPECT_NE(r.output.find("process rank 1 with PID"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("on signal 9"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("not killed"), std::string::npos) << r.output;
  std::printf("rank 1 of 3 killed mid-all-reduce: the job ended %.2f s later\n", after_kill);
}

TEST(MpiFailure, TheCliNamesTheRankAndEndsTheJob) {
  const MpiRun r = mpirun(2, std::string(OMNITRON_BINARY) + " train --no-such-flag");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << r.output;
  EXPECT_NE(r.output.find(" of 2]: error: unknown option --no-such-flag"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("omnitron train [rank "), std::string::npos) << r.output;
}

}  // namespace

#endif  // OMNITRON_MPI_CHECK
