// The NCCL communicator over device memory (built with OMNITRON_NCCL; on ROCm the same source
// builds against RCCL, whose API is NCCL's). One process per GPU, started by mpirun or srun
// (MPI carries the NCCL unique id from rank 0 to the others) or by torchrun (its TCP
// rendezvous world does: comm/rendezvous.h); then every collective and point-to-point call
// moves device buffers over NVLink/PCIe/InfiniBand through NCCL.
//
// Ordering with compute: the communicator enqueues on its own stream, created as a blocking
// stream, so it waits for work on the legacy default stream (where the GPU ops go when no
// stream is given) and that stream waits for it. Blocking calls return once the operation has
// completed on the device; non-blocking ones return a CommRequest whose wait() does.
//
// Point-to-point: NCCL has no tags and matches sends and receives per peer in the order they
// were issued, so both sides must issue them in the same order (the pipeline schedules do);
// tags are accepted and ignored. A single ncclSend blocks the GPU until the peer's ncclRecv
// runs, so two ranks that each isend then irecv would deadlock if the calls were launched one
// by one: isend/irecv are held back and launched together as one NCCL group (which progresses
// all of them at once) on the next wait(), test(), or any other call of this communicator.
// As with MPI, a buffer handed to isend/irecv must stay untouched until wait(), and every
// request must complete (or be destroyed) before its communicator is.
#pragma once

#if defined(OMNITRON_NCCL)

#include <memory>
#include <string>

#include "comm/communicator.h"

namespace omni {

// An NCCL communicator over the ranks of `host` (the world: MPI's, or torchrun's), named
// `name`.
// Collective over `host`: rank 0 creates the NCCL unique id and broadcasts it with
// host.broadcast. Selects the GPU first: the launcher's local rank (launcher_local_rank() in
// backend/device.h) modulo the visible devices. UsageError when no GPU is visible.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host,
                                                     const std::string& name = "world");

// "NCCL 2.28.9" (or "RCCL ..."): the library loaded at run time, for `omnitron info`.
std::string nccl_version();

}  // namespace omni

#endif  // OMNITRON_NCCL
