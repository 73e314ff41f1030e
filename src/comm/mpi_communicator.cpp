#ifdef OMNITRON_MPI

#include "comm/mpi_communicator.h"

// The C API only (CMake links MPI::MPI_C, not the deprecated C++ bindings).
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <vector>

#include "base/error.h"
#include "comm/watchdog.h"

namespace omni {

namespace {

void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  throw InternalError(std::string("[comm] ") + call + " failed: " + std::string(text, len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::F32: return MPI_FLOAT;
    case DType::F64: return MPI_DOUBLE;
    case DType::BF16:
    case DType::F16: return MPI_UINT16_T;  // moved, never reduced
  }
  throw InternalError("[comm] unknown dtype");
}

MPI_Datatype reducible_type(DType t) {
  OMNI_CHECK(t == DType::F32 || t == DType::F64, "[comm] reductions of ", dtype_name(t),
             " are not supported (f32 and f64 are)");
  return mpi_type(t);
}

MPI_Op mpi_op(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }

int count(size_t n) { return static_cast<int>(n); }

// [offset, length) pieces of at most max bytes; one empty piece for a message of no bytes.
std::vector<std::pair<size_t, size_t>> pieces(size_t bytes, size_t max) {
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t off = 0; off < bytes; off += max) out.emplace_back(off, std::min(max, bytes - off));
  if (out.empty()) out.emplace_back(0, 0);
  return out;
}

std::byte* at(void* p, size_t offset) { return static_cast<std::byte*>(p) + offset; }
const std::byte* at(const void* p, size_t offset) {
  return static_cast<const std::byte*>(p) + offset;
}

// MPI requests and the staging buffers they read or write.
class MpiRequest : public CommRequest {
 public:
  // What --distributed-timeout-minutes names if wait() blocks too long.
  MpiRequest(const char* op, std::shared_ptr<WatchGroup> group, size_t bytes, int peer)
      : op_(op),
        group_(std::move(group)),
        bytes_(bytes),
        peer_(peer),
        seq_(group_->count(op, bytes)) {}
  std::vector<MPI_Request> requests;
  std::vector<std::vector<std::byte>> staging;  // packed inputs of a chunked call

  ~MpiRequest() override {
    // While an exception unwinds, the job is failing (the CLI aborts it): do not wait for
    // peers that may never come.
    if (done_ || std::uncaught_exceptions() > 0) return;
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override {
    if (done_) return;
    CollectiveWatch watch(*group_, op_, bytes_, peer_, seq_);
    check(MPI_Waitall(count(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
    complete();
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    check(MPI_Testall(count(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
          "MPI_Testall");
    if (flag) complete();
    return done_;
  }

 private:
  void complete() {
    done_ = true;
    staging.clear();
  }
  bool done_ = false;
  const char* op_;
  std::shared_ptr<WatchGroup> group_;
  size_t bytes_;
  int peer_;
  uint64_t seq_;
};

class MpiCommunicator : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, std::string name, size_t max_count, bool owned)
      : comm_(comm), name_(std::move(name)), max_(max_count), owned_(owned) {
    check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
    check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
    // The world rank of each member, for the watchdog's reports.
    MPI_Group mine, world;
    check(MPI_Comm_group(comm_, &mine), "MPI_Comm_group");
    check(MPI_Comm_group(MPI_COMM_WORLD, &world), "MPI_Comm_group");
    std::vector<int> local(size_), global(size_);
    for (int k = 0; k < size_; ++k) local[k] = k;
    check(MPI_Group_translate_ranks(mine, size_, local.data(), world, global.data()),
          "MPI_Group_translate_ranks");
    MPI_Group_free(&mine);
    MPI_Group_free(&world);
    watch_ = std::make_shared<WatchGroup>(name_, rank_, std::move(global));
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  void all_reduce(void* data, size_t n, DType t, ReduceOp op) override {
    const MPI_Datatype type = reducible_type(t);
    CollectiveWatch watch(*watch_, "MPI_Allreduce", n * dtype_size(t));
    const size_t es = dtype_size(t);
    for (size_t off = 0; off < n; off += max_)
      check(MPI_Allreduce(MPI_IN_PLACE, at(data, off * es), count(std::min(max_, n - off)), type,
                          mpi_op(op), comm_),
            "MPI_Allreduce");
  }
  std::unique_ptr<CommRequest> iall_reduce(void* data, size_t n, DType t) override {
    const MPI_Datatype type = reducible_type(t);
    const size_t es = dtype_size(t);
    auto req = request("MPI_Iallreduce", n * dtype_size(t));
    for (size_t off = 0; off < n; off += max_) {
      MPI_Request r;
      check(MPI_Iallreduce(MPI_IN_PLACE, at(data, off * es), count(std::min(max_, n - off)), type,
                           MPI_SUM, comm_, &r),
            "MPI_Iallreduce");
      req->requests.push_back(r);
    }
    return req;
  }
  void reduce_scatter(void* out, const void* in, size_t n, DType t) override {
    ireduce_scatter(out, in, n, t)->wait();
  }
  std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                               DType t) override {
    const MPI_Datatype type = reducible_type(t);
    const size_t es = dtype_size(t);
    auto req = request("MPI_Ireduce_scatter_block", n * dtype_size(t));
    if (n <= max_) {
      MPI_Request r;
      check(MPI_Ireduce_scatter_block(in, out, count(n), type, MPI_SUM, comm_, &r),
            "MPI_Ireduce_scatter_block");
      req->requests.push_back(r);
      return req;
    }
    // Chunk c of every rank's block, packed together, reduces into chunk c of ours.
    for (size_t off = 0; off < n; off += max_) {
      const size_t m = std::min(max_, n - off);
      std::vector<std::byte>& packed = req->staging.emplace_back(size_ * m * es);
      for (int k = 0; k < size_; ++k)
        std::memcpy(packed.data() + k * m * es, at(in, (k * n + off) * es), m * es);
      MPI_Request r;
      check(MPI_Ireduce_scatter_block(packed.data(), at(out, off * es), count(m), type, MPI_SUM,
                                      comm_, &r),
            "MPI_Ireduce_scatter_block");
      req->requests.push_back(r);
    }
    return req;
  }
  void all_gather(void* out, const void* in, size_t n, DType t) override {
    const MPI_Datatype type = mpi_type(t);
    const size_t es = dtype_size(t);
    const bool in_place = in == at(static_cast<const void*>(out), rank_ * n * es);
    CollectiveWatch watch(*watch_, "MPI_Allgather", n * es);
    if (n <= max_) {
      check(MPI_Allgather(in_place ? MPI_IN_PLACE : in, count(n), type, out, count(n), type, comm_),
            "MPI_Allgather");
      return;
    }
    std::vector<std::byte> gathered;
    for (size_t off = 0; off < n; off += max_) {
      const size_t m = std::min(max_, n - off);
      gathered.resize(size_ * m * es);
      check(MPI_Allgather(at(in, off * es), count(m), type, gathered.data(), count(m), type, comm_),
            "MPI_Allgather");
      for (int k = 0; k < size_; ++k)
        std::memcpy(at(out, (k * n + off) * es), gathered.data() + k * m * es, m * es);
    }
  }
  void all_to_all(void* out, const void* in, size_t n, DType t) override {
    const MPI_Datatype type = mpi_type(t);
    CollectiveWatch watch(*watch_, "MPI_Alltoall", n * dtype_size(t));
    const size_t es = dtype_size(t);
    if (n <= max_) {
      check(MPI_Alltoall(in, count(n), type, out, count(n), type, comm_), "MPI_Alltoall");
      return;
    }
    std::vector<std::byte> send, recv;
    for (size_t off = 0; off < n; off += max_) {
      const size_t m = std::min(max_, n - off);
      send.resize(size_ * m * es);
      recv.resize(size_ * m * es);
      for (int k = 0; k < size_; ++k)
        std::memcpy(send.data() + k * m * es, at(in, (k * n + off) * es), m * es);
      check(MPI_Alltoall(send.data(), count(m), type, recv.data(), count(m), type, comm_),
            "MPI_Alltoall");
      for (int k = 0; k < size_; ++k)
        std::memcpy(at(out, (k * n + off) * es), recv.data() + k * m * es, m * es);
    }
  }
  void broadcast(void* data, size_t bytes, int root) override {
    CollectiveWatch watch(*watch_, "MPI_Bcast", bytes);
    for (size_t off = 0; off < bytes; off += max_)
      check(MPI_Bcast(at(data, off), count(std::min(max_, bytes - off)), MPI_BYTE, root, comm_),
            "MPI_Bcast");
  }
  void send(const void* data, size_t bytes, int peer, int tag) override {
    CollectiveWatch watch(*watch_, "MPI_Send", bytes, peer);
    for (const auto& [off, len] : pieces(bytes, max_))
      check(MPI_Send(at(data, off), count(len), MPI_BYTE, peer, tag, comm_), "MPI_Send");
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    CollectiveWatch watch(*watch_, "MPI_Recv", bytes, peer);
    for (const auto& [off, len] : pieces(bytes, max_)) {
      MPI_Status status;
      check(MPI_Recv(at(data, off), count(len), MPI_BYTE, peer, tag, comm_, &status), "MPI_Recv");
      int got = 0;
      MPI_Get_count(&status, MPI_BYTE, &got);
      OMNI_CHECK(got == count(len), "[comm ", name_, "] received ", got, " bytes from rank ", peer,
                 " (tag ", tag, ") where ", len, " were expected");
    }
  }
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int peer, int tag) override {
    auto req = request("MPI_Isend", bytes, peer);
    for (const auto& [off, len] : pieces(bytes, max_)) {
      MPI_Request r;
      check(MPI_Isend(at(data, off), count(len), MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
      req->requests.push_back(r);
    }
    return req;
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int peer, int tag) override {
    auto req = request("MPI_Irecv", bytes, peer);
    for (const auto& [off, len] : pieces(bytes, max_)) {
      MPI_Request r;
      check(MPI_Irecv(at(data, off), count(len), MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
      req->requests.push_back(r);
    }
    return req;
  }
  void barrier() override {
    CollectiveWatch watch(*watch_, "MPI_Barrier", 0);
    check(MPI_Barrier(comm_), "MPI_Barrier");
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    OMNI_CHECK(color >= 0, "[comm ", name_, "] split with negative color ", color);
    MPI_Comm part;
    CollectiveWatch watch(*watch_, "MPI_Comm_split", 0);
    check(MPI_Comm_split(comm_, color, key, &part), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(part, name, max_, true);
  }

 private:
  std::unique_ptr<MpiRequest> request(const char* op, size_t bytes, int peer = -1) const {
    return std::make_unique<MpiRequest>(op, watch_, bytes, peer);
  }
  std::shared_ptr<WatchGroup> watch_;
  MPI_Comm comm_;
  std::string name_;
  size_t max_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

constexpr int kHostChars = HOST_NAME_MAX + 1;  // a host name and its terminating zero

int env_int(const char* var) {
  const char* v = std::getenv(var);
  return v ? std::atoi(v) : 0;
}

}  // namespace

std::unique_ptr<Communicator> make_mpi_world(size_t max_count) {
  OMNI_CHECK(max_count >= 1 && max_count <= INT_MAX, "[comm] max_count ", max_count);
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::atexit(finalize_at_exit);
    OMNI_CHECK(provided >= MPI_THREAD_FUNNELED, "[comm] MPI provides thread level ", provided,
               ", below MPI_THREAD_FUNNELED");
    // Errors come back as exceptions (with the rank in the CLI's message) rather than
    // MPI's own abort.
    check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
  }
  int rank = 0, size = 1;
  check(MPI_Comm_rank(MPI_COMM_WORLD, &rank), "MPI_Comm_rank");
  check(MPI_Comm_size(MPI_COMM_WORLD, &size), "MPI_Comm_size");
  set_collective_world(rank, size, mpi_abort_world);
  // The watchdog's exchange directory (comm/watchdog.h): rank 0's choice, on every rank.
  char dir[1024] = {};
  if (rank == 0) std::snprintf(dir, sizeof dir, "%s", make_hang_dir().c_str());
  check(MPI_Bcast(dir, sizeof dir, MPI_CHAR, 0, MPI_COMM_WORLD), "MPI_Bcast");
  set_hang_dir(dir);
  // Every rank's host, for the watchdog's lines about ranks on other hosts.
  std::vector<char> hosts(size_t(size) * kHostChars);
  gethostname(hosts.data() + size_t(rank) * kHostChars, kHostChars - 1);
  check(MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, hosts.data(), kHostChars, MPI_CHAR,
                      MPI_COMM_WORLD),
        "MPI_Allgather");
  std::vector<std::string> names(size);
  for (int k = 0; k < size; ++k) names[k] = hosts.data() + size_t(k) * kHostChars;
  if (const std::string summary = hosts_summary(names); rank == 0 && !summary.empty()) {
    std::printf("omnitron: %s\n", summary.c_str());
    std::fflush(stdout);
  }
  set_collective_hosts(std::move(names));
  auto world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", max_count, false);
  // A launcher that announced several ranks while MPI sees one: an MPI other than the
  // launcher's, or srun without an MPI plugin. Each rank would train alone.
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}) {
    const int announced = env_int(var);
    OMNI_REQUIRE(world->size() > 1 || announced <= 1, "the launcher started ", announced,
                 " ranks (", var, "=", announced,
                 ") but MPI sees one, so each would train "
                 "alone: with srun add --mpi=pmix (or pmi2); with mpirun use the MPI omnitron "
                 "was built with; see docs/launching.md");
  }
  return world;
}

void mpi_abort_world(int code) {
  int initialized = 0, finalized = 0, size = 1;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (!initialized || finalized) return;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (size <= 1) return;
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
}

}  // namespace omni

#endif  // OMNITRON_MPI
