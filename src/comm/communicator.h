// Communicator: the collectives and point-to-point calls every parallel layout is built
// from (DESIGN.md: src/comm). One interface, three implementations: a single-rank one
// (every collective is a copy or nothing; TP=1 is not a special case), MPI over host
// memory (comm/mpi_communicator.cpp), and NCCL/RCCL over device memory (with the GPU
// backend). Buffers are typed by DType; sums of f32 are done in f32 as MPI does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "base/dtype.h"
#include "tensor/tensor.h"

namespace omni {

enum class ReduceOp { Sum, Max };

// A pending non-blocking operation. wait() completes it (idempotent); the destructor
// waits too, so a buffer is never released while MPI still reads it (except while an
// exception unwinds the stack: then the job is failing and the request is abandoned).
// test() is true once it has completed; calling it now and then lets MPI progress a
// collective while the caller computes (MPI moves data only inside MPI calls).
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  virtual void wait() = 0;
  virtual bool test() = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "tp", "dp", ... for messages; "world" for the world.
  virtual std::string name() const = 0;
  // True when buffers may live in a real GPU's memory (NCCL/RCCL). Such a communicator takes
  // host buffers too: the blocking calls stage them through device memory, so a model on the
  // GPU can still sum its host-side scalars (losses, norms, counts) over its groups.
  virtual bool device_memory() const { return false; }

  // In place over n elements of every rank.
  virtual void all_reduce(void* data, size_t n, DType t, ReduceOp op = ReduceOp::Sum) = 0;
  // in holds size() blocks of n elements; rank r receives the sum of every rank's block r.
  virtual void reduce_scatter(void* out, const void* in, size_t n, DType t) = 0;
  // Each rank contributes n elements; out holds size() blocks of n, in rank order. May be
  // in place: in == out + rank() * n elements.
  virtual void all_gather(void* out, const void* in, size_t n, DType t) = 0;
  // Each rank sends block r of `in` (n elements) to rank r; out holds the blocks received,
  // in rank order.
  virtual void all_to_all(void* out, const void* in, size_t n, DType t) = 0;
  // Blocks of varying size (MPI_Alltoallv): `in` holds send_counts[r] elements for each rank r
  // back to back in rank order, `out` receives recv_counts[r] elements from each rank r, back
  // to back in rank order (every rank's send count to r is r's receive count from it). Built
  // on isend/irecv and host memcpy, so every host-memory implementation has it; NCCL's
  // overrides it with one group of sends and receives; buffers must not overlap.
  virtual void all_to_all_v(void* out, const size_t* recv_counts, const void* in,
                            const size_t* send_counts, DType t);
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  virtual void send(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual void recv(void* data, size_t bytes, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int peer, int tag) = 0;
  virtual std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int peer, int tag) = 0;
  // Starts an in-place sum; the data must not be touched until wait().
  virtual std::unique_ptr<CommRequest> iall_reduce(void* data, size_t n, DType t) = 0;
  // Starts a reduce_scatter (sum); neither buffer may be touched until wait(), and out
  // must not overlap in.
  virtual std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                                       DType t) = 0;
  virtual void barrier() = 0;
  // A communicator over the ranks that pass the same color (>= 0), ordered by key, then by
  // rank (MPI_Comm_split). Collective: every rank of this communicator calls it.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name) = 0;

  template <typename T>
  void all_reduce(T* data, size_t n, ReduceOp op = ReduceOp::Sum) {
    all_reduce(static_cast<void*>(data), n, dtype_of<T>(), op);
  }
  template <typename T>
  void all_gather(T* out, const T* in, size_t n) {
    all_gather(static_cast<void*>(out), static_cast<const void*>(in), n, dtype_of<T>());
  }
  template <typename T>
  void reduce_scatter(T* out, const T* in, size_t n) {
    reduce_scatter(static_cast<void*>(out), static_cast<const void*>(in), n, dtype_of<T>());
  }
};

// One rank: collectives copy or do nothing; point-to-point with itself is an error.
std::unique_ptr<Communicator> make_self_communicator(const std::string& name = "world");

// The world: torchrun's ranks when torchrun started this process (RANK, WORLD_SIZE,
// MASTER_ADDR, MASTER_PORT: comm/rendezvous.h, host collectives over a TCP rendezvous that
// connects at the first collective); else MPI when mpirun/srun started it
// (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK is set, or SLURM_STEP_NUM_TASKS is above 1);
// else one rank without calling MPI_Init (a singleton MPI_Init is slow). Initialises MPI on
// first use; MPI is finalized at exit. UsageError when launched as several ranks in a build
// without MPI.
Communicator& world_communicator();

// For the failing rank's error path (only src/cli calls it): with more than one rank,
// print nothing more and end every rank of the job (MPI_Abort) with `code`; with one
// rank, return and let the caller exit.
void abort_world(int code);

}  // namespace omni
