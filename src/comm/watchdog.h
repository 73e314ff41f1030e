// Megatron's --distributed-timeout-minutes for our MPI communicator: a rank that waits longer
// than the timeout inside one blocking collective (a peer never came: it hung, died quietly or
// took another path) ends the whole job with one line naming the rank, the call, the group
// and the timeout, as PyTorch's NCCL watchdog does, instead of waiting forever.
//
//   set_collective_timeout(opts.distributed_timeout_minutes * 60);   // 0: wait forever
//   { CollectiveWatch watch("MPI_Allreduce", "dp", 0, 2); MPI_Allreduce(...); }
//
// A watchdog thread (started with the first positive timeout) checks the call in progress.
// The blocked thread cannot be unwound, so this is the one place outside src/cli that ends
// the process: it prints the line to stderr and calls the abort set by
// set_collective_abort (MPI_Abort of the world), then _Exit if that returns.
#pragma once

#include <string>

namespace omni {

// Seconds a blocking call may wait; <= 0 turns the watchdog off. `flag_value` is the text
// the message quotes ("--distributed-timeout-minutes 0.05").
void set_collective_timeout(double seconds, const std::string& flag_value = "");
double collective_timeout();

// The world rank and size the message names, and what ends the job (the MPI communicator
// sets these when MPI starts).
void set_collective_world(int rank, int size, void (*abort_job)(int code));

// Marks one blocking call of the calling thread, from construction to destruction. Cheap
// when no timeout is set (one atomic load). `op` must outlive the watch (a literal).
class CollectiveWatch {
 public:
  CollectiveWatch(const char* op, const std::string& group, int group_rank, int group_size);
  ~CollectiveWatch();
  CollectiveWatch(const CollectiveWatch&) = delete;
  CollectiveWatch& operator=(const CollectiveWatch&) = delete;

 private:
  bool active_ = false;
};

}  // namespace omni
