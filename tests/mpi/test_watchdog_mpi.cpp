// --distributed-timeout-minutes: a rank that never joins a collective ends the job (rather
// than a hang) with one line naming the waiting rank, the MPI call and the timeout. Both jobs
// run under `timeout 60` (mpirun.h): a hang shows as exit status 124.
#ifdef OMNITRON_MPI_CHECK

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "comm/hang_expectations.h"
#include "mpirun.h"

namespace {

const std::string kCheck = OMNITRON_MPI_CHECK;

TEST(CollectiveTimeout, ARankThatNeverJoinsAnAllReduceEndsTheJob) {
  const MpiRun r = mpirun(3, kCheck + " stall 0.05");  // 3 s
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job did not end within 60 s:\n" << r.output;
  EXPECT_EQ(r.output.find("did not end the job"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" of 3]: error: MPI_Allreduce on the world group"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("longer than --distributed-timeout-minutes 0.05 (3.0 s)"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(r.output.find("[rank 1 of 3]: error"), std::string::npos)
      << "rank 1 never called the all-reduce:\n"
      << r.output;
  std::printf("a rank never joined: the job ended %.1f s after mpirun started (timeout 3 s)\n",
              r.seconds);
}

TEST(CollectiveTimeout, TrainWithTheFlagEndsWhenAPeerNeverJoins) {
  // Rank 0 trains; rank 1 is an MPI process that never calls a collective, so rank 0's first
  // barrier (after opening the data) never completes.
  const std::string train = std::string(OMNITRON_BINARY) +
                            " train --mock-data --vocab-size 64 --num-layers 1 --hidden-size 16 "
                            "--num-attention-heads 2 --seq-length 8 --micro-batch-size 1 "
                            "--train-iters 2 --distributed-timeout-minutes 0.05";
  const MpiRun r = mpirun(1, train + " : -np 1 " + kCheck + " idle");
  EXPECT_NE(r.exit_code, 0) << r.output;
  EXPECT_NE(r.exit_code, 124) << "the job did not end within 60 s:\n" << r.output;
  EXPECT_EQ(r.output.find("idle for 120 s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("omnitron [rank 0 of 2]: error: MPI_Barrier on the world group"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("--distributed-timeout-minutes 0.05"), std::string::npos) << r.output;
  std::printf("train with a peer that never joins ended after %.1f s\n", r.seconds);
}

// Each hang of comm/hang_scenarios.h under mpirun (4 ranks): the first report at 1 s, then
// at the timeout (3 s) the report again and the end of the job, within the timeout + 10 s.
class HangReportMpi : public ::testing::TestWithParam<const char*> {};

TEST_P(HangReportMpi, NamesTheRankGroupAndOperation) {
  const HangCase c = hang_case(GetParam(), "MPI_Allreduce", "MPI_Send");
  const MpiRun r = mpirun(4, kCheck + " watchdog " + c.scenario + " 1 0.05");
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 3 + 10) << r.output;
  EXPECT_EQ(r.output.find("did not end the job"), std::string::npos) << r.output;
  const std::string head = "omnitron hang report: the longest wait is " + c.report;
  const size_t report = r.output.find(head);
  ASSERT_NE(report, std::string::npos) << r.output;
  // The rank that is behind, on that line: what it is doing.
  const size_t line_end = r.output.find('\n', report + head.size());
  EXPECT_LT(r.output.find(c.phase, report), line_end) << r.output;
  // Each rank's own line, twice (the first report and the timeout's).
  for (int k = 0; k < 4; ++k)
    EXPECT_NE(r.output.find("omnitron hang [rank " + std::to_string(k) + " of 4, host "),
              std::string::npos)
        << r.output;
  EXPECT_NE(r.output.find("--distributed-timeout-minutes 0.05 (3.0 s)"), std::string::npos)
      << r.output;
  std::printf("%s under mpirun: the job ended after %.1f s (timeout 3 s)\n", c.scenario, r.seconds);
}

INSTANTIATE_TEST_SUITE_P(Scenarios, HangReportMpi,
                         ::testing::Values("skip", "stall", "data", "send"));

}  // namespace

#endif  // OMNITRON_MPI_CHECK
