// What the watchdog says about hosts (comm/watchdog.h, set_collective_hosts): rank 0's
// start-up line of which ranks run where, and the line of a rank that the launcher ends with
// SIGTERM while it waits in a call with ranks on another host (a lost host: Open MPI names
// only the host). Across real hosts: tests/comm/multihost_check.sh.
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "comm/watchdog.h"

namespace {

TEST(HostsSummary, NamesEachHostWithItsRanksAsRuns) {
  EXPECT_EQ(omni::hosts_summary({"node0", "node0", "node1", "node1"}),
            "4 ranks on 2 hosts: node0 (ranks 0-1), node1 (ranks 2-3)");
  EXPECT_EQ(omni::hosts_summary({"a", "b", "a", "b", "a", "a", "c"}),
            "7 ranks on 3 hosts: a (ranks 0,2,4-5), b (ranks 1,3), c (rank 6)");
}

TEST(HostsSummary, IsEmptyOnOneHost) {
  EXPECT_EQ(omni::hosts_summary({"vm", "vm", "vm"}), "");
  EXPECT_EQ(omni::hosts_summary({"vm"}), "");
}

// Rank 0 of 4 (on node0) waits in a tensor-parallel all-reduce with rank 1 (node1) and in
// nothing else; the launcher's SIGTERM then prints the line and still ends the process.
void wait_in_a_call_and_get_sigterm(const std::vector<std::string>& hosts) {
  omni::set_collective_timeout(600, "--distributed-timeout-minutes 10");
  omni::watch_this_thread(0, 4);
  omni::set_collective_hosts(hosts);
  omni::WatchGroup tp("tp", 0, {0, 1});
  tp.count("MPI_Allreduce", 4);  // an earlier call: this one is #2
  omni::CollectiveWatch watch(tp, "MPI_Allreduce", 4096);
  raise(SIGTERM);
  std::_Exit(0);  // not reached: SIGTERM ends the process
}

TEST(TerminationLine, NamesTheRanksOnOtherHostsOfTheCallItWaitsIn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(wait_in_a_call_and_get_sigterm({"node0", "node1", "node0", "node1"}),
              ::testing::KilledBySignal(SIGTERM),
              "omnitron \\[rank 0 of 4, host node0\\]: ended by the launcher \\(SIGTERM\\) after "
              "waiting 0\\.[0-9] s in MPI_Allreduce #2 on tp, whose ranks on other hosts are 1 "
              "on node1\n");
}

TEST(TerminationLine, IsNotPrintedOnOneHost) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  // The handler is not installed: SIGTERM ends the process without a word.
  EXPECT_EXIT(wait_in_a_call_and_get_sigterm({"vm", "vm", "vm", "vm"}),
              ::testing::KilledBySignal(SIGTERM), "^$");
}

}  // namespace
