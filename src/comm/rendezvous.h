// Starting under torchrun: the environment torchrun gives each process, a TCP rendezvous at
// MASTER_ADDR:MASTER_PORT that connects the ranks without MPI, and a host-memory world
// communicator over it.
//
// Why a rendezvous of our own: torchrun starts WORLD_SIZE processes and tells each its RANK,
// LOCAL_RANK and where rank 0 is (MASTER_ADDR, MASTER_PORT), but no MPI. PyTorch's ranks meet
// in its TCPStore there; ours meet in this rendezvous: rank 0 listens, the others connect, and
// every rank learns that all WORLD_SIZE have arrived, or stops with one line naming the
// address, the port and how many arrived (within OMNITRON_RENDEZVOUS_TIMEOUT seconds, else
// --distributed-timeout-minutes, else 300 s).
//
// What the communicator carries: host collectives of small buffers through rank 0 as a hub
// (each rank sends its part to rank 0, which combines them in rank order and sends each rank
// its result): broadcast, barrier, all-reduce (f32/f64), all-gather, reduce-scatter and
// all-to-all. That is what the start of a GPU run needs (make_nccl_communicator broadcasts the
// NCCL unique id over it) and what host-side agreement needs; the training collectives on
// device buffers, the process-grid splits and the pipeline's sends go through NCCL/RCCL. So
// split and point-to-point calls are InternalErrors naming NCCL. CPU ranks need those, which
// is why CPU ranks run under mpirun, not torchrun (the CLI says so in one line).
//
// The world connects lazily, at its first collective: rank and size come from the environment
// at once, so an error found before any communication (an option, the device) stops every
// rank by itself instead of leaving its peers waiting at the rendezvous.
//
// A collective whose operation or size differs between ranks is an InternalError naming both;
// a rank that dies closes its sockets, and its peers' calls end with an error naming it.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "comm/communicator.h"

namespace omni {

// What torchrun (or torch.distributed.launch, or a script that sets the same variables) told
// this process.
struct TorchrunEnvironment {
  int rank = 0;              // RANK
  int world_size = 1;        // WORLD_SIZE
  int local_rank = 0;        // LOCAL_RANK (0 when unset)
  int local_world_size = 1;  // LOCAL_WORLD_SIZE (1 when unset)
  std::string master_addr;   // MASTER_ADDR (needed when WORLD_SIZE > 1)
  int master_port = 0;       // MASTER_PORT (needed when WORLD_SIZE > 1)
  // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent itself listens on MASTER_PORT (its
  // TCPStore), so the rendezvous takes the next port.
  bool agent_holds_master_port = false;
};

// The torchrun environment when it describes this process: RANK and WORLD_SIZE are set, and
// either torchrun's agent started this process (TORCHELASTIC_RUN_ID is set) or no MPI launcher
// did (no OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK: under mpirun, MPI's world wins).
// srun's SLURM_* variables do not count: `srun torchrun ...` starts torchrun once per node.
// nullopt otherwise. UsageError naming the variable when one is not a number in range, or
// when MASTER_ADDR/MASTER_PORT are missing for several ranks.
std::optional<TorchrunEnvironment> torchrun_environment();

// Where rank 0 listens and the others connect, and how long they wait for each other.
struct RendezvousConfig {
  std::string address;  // MASTER_ADDR: a host name or an IPv4/IPv6 address
  int port = 0;
  int rank = 0, size = 1;
  // 0: rendezvous_timeout_seconds() when the first collective connects (by then the trainer
  // has set --distributed-timeout-minutes).
  double timeout_seconds = 0;
  // What the messages call the address ("MASTER_ADDR:MASTER_PORT localhost:6000").
  std::string described_as;
  // Register the world with the collective watchdog (comm/watchdog.h) on connecting.
  bool watched = false;
};

// The rendezvous of the torchrun world: MASTER_ADDR, and MASTER_PORT (+1 when torchrun's agent
// holds it; OMNITRON_RENDEZVOUS_PORT overrides the port); the timeout is decided on connecting.
RendezvousConfig torchrun_rendezvous(const TorchrunEnvironment& env);

// OMNITRON_RENDEZVOUS_TIMEOUT (seconds) when set; else the collective timeout
// (--distributed-timeout-minutes, comm/watchdog.h) when one is set; else 300.
double rendezvous_timeout_seconds();

// A communicator over `config.size` processes that connects at its first collective (see
// above). Each of the processes makes one with its own rank and the same address and port.
std::unique_ptr<Communicator> make_rendezvous_communicator(const RendezvousConfig& config,
                                                           const std::string& name = "world");

}  // namespace omni
