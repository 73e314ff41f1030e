// In-process ranks for tests: every rank is a thread of this process, and every
// Communicator call works as it does over MPI, so a parallel layout is tested without
// mpirun.
//
//   omni::run_ranks(4, [&](omni::Communicator& world) {
//     omni::ProcessGrid grid(world, layout);       // splits work as in MPI
//     std::vector<float> g = ...;                  // this rank's data
//     grid.dp().all_reduce(g.data(), g.size());    // sums in rank order: deterministic
//     results[world.rank()] = g;                   // write to shared state per rank only
//   });
//
// Failures never hang a test: when a rank throws, peers waiting in a collective, a
// receive or a request's wait() get a PeerFailure, and run_ranks rethrows the first
// rank's exception (its type and message). When every rank waits and none can proceed
// (a receive nobody sends, a collective one rank skipped, a rank that returned while
// others wait for it), every rank gets an InternalError naming what each rank waits
// for, and run_ranks throws it. Sends are synchronous (complete when received), the
// strictest behaviour MPI allows, so a layout that passes here does not depend on MPI
// buffering.
#pragma once

#include <functional>
#include <stdexcept>
#include <string>

#include "comm/communicator.h"

namespace omni {

// What a rank gets from a communication call when another rank has failed.
class PeerFailure : public std::runtime_error {
 public:
  explicit PeerFailure(const std::string& what) : std::runtime_error(what) {}
};

// Runs fn on n threads, rank r of one world of n ranks on thread r; returns when all
// have returned, or rethrows the first failure.
void run_ranks(int n, const std::function<void(Communicator& world)>& fn);

}  // namespace omni
