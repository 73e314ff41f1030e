// The collective watchdog's four hang scenarios, run the same way under mpirun
// (omnitron_mpi_check hang-SCENARIO) and in-process (comm/test_hang_report.cpp): four ranks,
// dp groups {0,2} and {1,3}, pp groups {0,1} and {2,3}; rank 2 is the one that goes wrong.
//   skip   rank 2 skips the dp all-reduce and computes on (forward-compute microbatch 1)
//   stall  rank 2 stalls inside the dp all-reduce, before the transport
//   data   rank 2 is stuck in data loading (batch-generator microbatch 0)
//   send   rank 2 sends 4 MiB to rank 3 on pp; rank 3 never receives (backward-compute)
// Every rank ends in a world barrier, so only the watchdog ends the job.
#pragma once

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "base/trace.h"
#include "comm/communicator.h"
#include "comm/watchdog.h"

namespace omni::testing {

inline void run_hang_scenario(Communicator& world, const std::string& scenario) {
  const int r = world.rank();
  auto dp = world.split(r % 2, r, "dp");
  auto pp = world.split(r / 2, r, "pp");
  const auto stuck = [] { std::this_thread::sleep_for(std::chrono::seconds(120)); };
  float x = 1;
  if (scenario == "skip") {
    if (r == 2) {
      TraceSpan span("forward-compute", "microbatch", 1);
      stuck();
    }
    dp->all_reduce(&x, 1);
  } else if (scenario == "stall") {
    if (r == 2) omni::testing::stall_inside_next_call(120);
    dp->all_reduce(&x, 1);
  } else if (scenario == "data") {
    if (r == 2) {
      TraceSpan span("batch-generator", "microbatch", 0);
      stuck();
    }
    dp->all_reduce(&x, 1);
  } else if (scenario == "send") {
    std::vector<char> activations(4 << 20);
    if (r == 2) {
      TraceSpan span("forward-send", "microbatch", 0);
      pp->send(activations.data(), activations.size(), 1, 0);
    }
    if (r == 3) {
      TraceSpan span("backward-compute", "microbatch", 0);
      stuck();
    }
  }
  world.barrier();
}

}  // namespace omni::testing
