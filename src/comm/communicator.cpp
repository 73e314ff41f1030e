#include "comm/communicator.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "base/error.h"
#include "comm/mpi_communicator.h"
#include "comm/rendezvous.h"
#include "comm/watchdog.h"

namespace omni {

namespace {

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class SelfCommunicator : public Communicator {
 public:
  // Counted as every communicator's calls are (comm/watchdog.h); one rank never waits.
  explicit SelfCommunicator(std::string name)
      : name_(std::move(name)), watch_(name_, 0, std::vector<int>{0}) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return name_; }
  void all_reduce(void*, size_t n, DType t, ReduceOp) override {
    watch_.count("all_reduce", n * dtype_size(t));
  }
  void reduce_scatter(void* out, const void* in, size_t n, DType t) override {
    watch_.count("reduce_scatter", n * dtype_size(t));
    copy(out, in, n * dtype_size(t));
  }
  void all_gather(void* out, const void* in, size_t n, DType t) override {
    watch_.count("all_gather", n * dtype_size(t));
    copy(out, in, n * dtype_size(t));
  }
  void all_to_all(void* out, const void* in, size_t n, DType t) override {
    watch_.count("all_to_all", n * dtype_size(t));
    copy(out, in, n * dtype_size(t));
  }
  void broadcast(void*, size_t bytes, int root) override {
    watch_.count("broadcast", bytes);
    OMNI_CHECK(root == 0, "[comm ", name_, "] broadcast from rank ", root, " of 1");
  }
  void send(const void*, size_t, int peer, int) override { no_peer(peer); }
  void recv(void*, size_t, int peer, int) override { no_peer(peer); }
  std::unique_ptr<CommRequest> isend(const void*, size_t, int peer, int) override {
    no_peer(peer);
    return nullptr;
  }
  std::unique_ptr<CommRequest> irecv(void*, size_t, int peer, int) override {
    no_peer(peer);
    return nullptr;
  }
  std::unique_ptr<CommRequest> iall_reduce(void*, size_t n, DType t) override {
    watch_.count("iall_reduce", n * dtype_size(t));
    return std::make_unique<DoneRequest>();
  }
  std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                               DType t) override {
    reduce_scatter(out, in, n, t);
    return std::make_unique<DoneRequest>();
  }
  void barrier() override { watch_.count("barrier", 0); }
  std::unique_ptr<Communicator> split(int, int, const std::string& name) override {
    return std::make_unique<SelfCommunicator>(name);
  }

 private:
  static void copy(void* out, const void* in, size_t bytes) {
    if (out != in) std::memmove(out, in, bytes);
  }
  [[noreturn]] void no_peer(int peer) const {
    throw InternalError("[comm " + name_ + "] point-to-point with rank " + std::to_string(peer) +
                        " in a communicator of one rank");
  }
  std::string name_;
  WatchGroup watch_;
};

}  // namespace

void Communicator::all_to_all_v(void* out, const size_t* recv_counts, const void* in,
                                const size_t* send_counts, DType t) {
  constexpr int kTag = 0x6570;  // "ep": expert dispatch is these calls' only user
  const size_t es = dtype_size(t);
  const int n = size(), me = rank();
  std::vector<size_t> send_at(n + 1, 0), recv_at(n + 1, 0);
  for (int r = 0; r < n; ++r) {
    send_at[r + 1] = send_at[r] + send_counts[r];
    recv_at[r + 1] = recv_at[r] + recv_counts[r];
  }
  OMNI_CHECK(send_counts[me] == recv_counts[me], "[comm ", name(), "] all_to_all_v sends ",
             send_counts[me], " elements to itself but receives ", recv_counts[me]);
  auto* o = static_cast<std::byte*>(out);
  const auto* i = static_cast<const std::byte*>(in);
  // Receives first, then sends, each in rank order from this rank on (a ring order, so no
  // pair of ranks waits on each other with synchronous sends); empty blocks are skipped on
  // both sides, which agree on the counts.
  std::vector<std::unique_ptr<CommRequest>> pending;
  for (int k = 1; k < n; ++k) {
    const int from = (me - k + n) % n;
    if (recv_counts[from] > 0)
      pending.push_back(irecv(o + recv_at[from] * es, recv_counts[from] * es, from, kTag));
  }
  for (int k = 1; k < n; ++k) {
    const int to = (me + k) % n;
    if (send_counts[to] > 0)
      pending.push_back(isend(i + send_at[to] * es, send_counts[to] * es, to, kTag));
  }
  if (send_counts[me] > 0)
    std::memcpy(o + recv_at[me] * es, i + send_at[me] * es, send_counts[me] * es);
  for (auto& r : pending) r->wait();
}

std::unique_ptr<Communicator> make_self_communicator(const std::string& name) {
  return std::make_unique<SelfCommunicator>(name);
}

}  // namespace omni

namespace omni {

namespace {

// The number of ranks a launcher announced: mpirun (OMPI_COMM_WORLD_SIZE), a PMI or PMIx
// launcher (PMI_SIZE, PMIX_RANK: -1, size unknown), srun (SLURM_STEP_NUM_TASKS, more than
// one); 0 when the process was started on its own. Read from the environment so that a
// process started alone never pays for MPI_Init.
int launched_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE"})
    if (const char* v = std::getenv(var)) return std::max(1, std::atoi(v));
  if (std::getenv("PMIX_RANK")) return -1;
  if (const char* v = std::getenv("SLURM_STEP_NUM_TASKS"); v && std::atoi(v) > 1)
    return std::atoi(v);
  return 0;
}

std::unique_ptr<Communicator> make_world() {
  if (const std::optional<TorchrunEnvironment> torchrun = torchrun_environment()) {
    if (torchrun->world_size == 1) return make_self_communicator("world");
    return make_rendezvous_communicator(torchrun_rendezvous(*torchrun), "world");
  }
  const int launched = launched_ranks();
#ifdef OMNITRON_MPI
  if (launched != 0) return make_mpi_world();
#else
  OMNI_REQUIRE(launched == 0 || launched == 1, "this process was started by a launcher as one of ",
               launched < 0 ? std::string("several") : std::to_string(launched),
               " ranks, but this omnitron was built without MPI (configure with "
               "-DOMNITRON_MPI=ON and an MPI installed)");
#endif
  return make_self_communicator("world");
}

}  // namespace

Communicator& world_communicator() {
  static std::unique_ptr<Communicator> world = make_world();
  return *world;
}

void abort_world(int code) {
#ifdef OMNITRON_MPI
  mpi_abort_world(code);
#else
  (void)code;
#endif
}

}  // namespace omni
