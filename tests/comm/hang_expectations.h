// What the hang report of each scenario of hang_scenarios.h must say, for a communicator
// whose all-reduce is `all_reduce` and whose send is `send` (the MPI and in-process names).
#pragma once

#include <string>

struct HangCase {
  const char* scenario;
  std::string report;  // the summary's first two lines (rank 0's view)
  std::string phase;   // where the rank that is behind is in its step
};

inline HangCase hang_case(const std::string& scenario, const std::string& all_reduce,
                          const std::string& send) {
  const std::string dp =
      "rank 0's " + all_reduce + " #1 on dp (world ranks 0,2); behind:\n  rank 2 ";
  if (scenario == "skip")
    return {"skip", dp + "(0 calls on dp): not in a communication call",
            "during forward-compute microbatch 1"};
  if (scenario == "stall")
    return {"stall", dp + "(1 calls on dp): stalled ",
            "inside, before the transport, " + all_reduce};
  if (scenario == "data")
    return {"data", dp + "(0 calls on dp): not in a communication call",
            "during batch-generator microbatch 0"};
  return {"send",
          "rank 2's " + send +
              " #1 on pp (world ranks 2,3); its peer is not in the matching call:\n  rank 3 ",
          "during backward-compute microbatch 0"};
}
