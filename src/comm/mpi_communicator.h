// The MPI communicator over host memory (built with OMNITRON_MPI). world_communicator()
// uses it when a launcher started the process; the MPI check program (tests/mpi) also makes
// worlds with a small max_count to exercise the chunked paths.
#pragma once

#ifdef OMNITRON_MPI

#include <climits>
#include <memory>

#include "comm/communicator.h"

namespace omni {

// MPI_COMM_WORLD, initialising MPI (MPI_THREAD_FUNNELED: only the main thread calls MPI) on
// first use and finalizing it at exit. Calls on more than max_count elements are split into
// several (MPI counts are ints). UsageError when the launcher announced several ranks and
// MPI sees one (srun without an MPI plugin, or another MPI's mpirun: each would train alone).
std::unique_ptr<Communicator> make_mpi_world(size_t max_count = INT_MAX);

// With MPI initialised and more than one rank: MPI_Abort(MPI_COMM_WORLD, code), which ends
// every rank of the job. Otherwise returns.
void mpi_abort_world(int code);

}  // namespace omni

#endif
