// Progress for non-blocking collectives while the caller computes. MPI moves a collective's
// data only inside MPI calls (OpenMPI's libnbc and shared-memory transport have no progress
// thread), so a bucket's all-reduce started before a layer's backward stalls until the next
// MPI call. Whoever has collectives outstanding registers a poll (a cheap MPI_Test of its
// requests); the CPU kernels call poll_comm_progress() between their pieces (each GEMM), so
// the collectives advance every few milliseconds of compute.
//
//   set_comm_progress(this, [this] { test_outstanding(); });  // while requests are pending
//   ... compute; kernels call poll_comm_progress() ...
//   set_comm_progress(this, nullptr);                          // before this goes away
#pragma once

#include <functional>

namespace omni {

// Registers (or with an empty poll, removes) `owner`'s poll. Polls run only on the thread that
// registered them (MPI_THREAD_FUNNELED: the main thread makes every MPI call).
void set_comm_progress(const void* owner, std::function<void()> poll);

// Runs every poll registered on this thread; nothing when none is (the common case: one
// relaxed atomic load).
void poll_comm_progress();

}  // namespace omni
