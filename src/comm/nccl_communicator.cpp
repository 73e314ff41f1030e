#if defined(OMNITRON_NCCL)

#include "comm/nccl_communicator.h"

#include "comm/watchdog.h"

#if defined(OMNITRON_HIP)
// RCCL implements NCCL's API; only the runtime's names differ. Checked with hipcc against
// NCCL's header retargeted to HIP types, not yet against a real RCCL installation.
#include <hip/hip_runtime.h>
#include <rccl/rccl.h>
#define OMNI_NCCL_LIBRARY "RCCL"
#define cudaError_t hipError_t
#define cudaSuccess hipSuccess
#define cudaErrorNotReady hipErrorNotReady
#define cudaGetErrorString hipGetErrorString
#define cudaGetDeviceCount hipGetDeviceCount
#define cudaSetDevice hipSetDevice
#define cudaStream_t hipStream_t
#define cudaStreamCreate hipStreamCreate
#define cudaStreamDestroy hipStreamDestroy
#define cudaEvent_t hipEvent_t
#define cudaEventCreateWithFlags hipEventCreateWithFlags
#define cudaEventDisableTiming hipEventDisableTiming
#define cudaEventRecord hipEventRecord
#define cudaEventQuery hipEventQuery
#define cudaEventDestroy hipEventDestroy
#define cudaMalloc hipMalloc
#define cudaMemset hipMemset
#define cudaFree hipFree
#define cudaMemcpyAsync hipMemcpyAsync
#define cudaMemcpyHostToDevice hipMemcpyHostToDevice
#define cudaMemcpyDeviceToHost hipMemcpyDeviceToHost
#define cudaStreamSynchronize hipStreamSynchronize
#define cudaGetLastError hipGetLastError
#define cudaPointerAttributes hipPointerAttribute_t
#define cudaPointerGetAttributes hipPointerGetAttributes
#define cudaMemoryTypeDevice hipMemoryTypeDevice
#define cudaMemoryTypeManaged hipMemoryTypeManaged
#else
#include <cuda_runtime.h>
#include <nccl.h>
#define OMNI_NCCL_LIBRARY "NCCL"
#endif

#include <algorithm>
#include <cstddef>
#include <exception>
#include <thread>
#include <utility>
#include <vector>

#include "backend/device.h"
#include "base/error.h"

namespace omni {

namespace {

// Runtime and NCCL calls name themselves in their errors, with NCCL's own last message
// (NCCL >= 2.13) and where to look next.
void check_gpu(cudaError_t rc, const char* call, const std::string& who) {
  if (rc == cudaSuccess) return;
  throw InternalError("[comm " + who + "] " + call + " failed: " + cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* call, const std::string& who, ncclComm_t comm) {
  if (rc == ncclSuccess) return;
  std::string detail;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
  if (const char* last = ncclGetLastError(comm); last && *last)
    detail = std::string(" (") + last + ")";
#endif
  throw InternalError("[comm " + who + "] " + call + " failed: " + ncclGetErrorString(rc) + detail +
                      "; rerun with NCCL_DEBUG=WARN for NCCL's own account");
}

#define OMNI_COMM_GPU_CHECK(call) check_gpu((call), #call, name_)
#define OMNI_NCCL_CHECK(call) check_nccl((call), #call, name_, comm_)

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::F32:
      return ncclFloat32;
    case DType::F64:
      return ncclFloat64;
    case DType::BF16:
      return ncclBfloat16;
    case DType::F16:
      return ncclFloat16;
  }
  throw InternalError("[comm] unknown dtype");
}

// Sums of bf16/f16 are rounded to that type at every step of NCCL's ring, which is why the
// trainer reduces gradients in f32 (Megatron's main_grad); NCCL accepts all four types.
ncclRedOp_t nccl_op(ReduceOp op) {
  return op == ReduceOp::Sum ? ncclSum : ncclMax;
}

// Whether NCCL can read `p`: device or managed memory. Host memory (the runtime does not know
// it, or it is pinned) is staged through device memory by the blocking calls.
bool on_device(const void* p) {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes fail on unregistered host memory: host
    return false;
  }
#if defined(OMNITRON_HIP) && HIP_VERSION_MAJOR < 6
  const auto type = a.memoryType;
#else
  const auto type = a.type;
#endif
  return type == cudaMemoryTypeDevice || type == cudaMemoryTypeManaged;
}

// Host buffers cross in pieces of at most this many bytes where the call allows it (sums and
// broadcasts), so staging a checkpoint's full-model sum costs no full-model device buffer.
constexpr size_t kStagePiece = size_t(64) << 20;

std::byte* at(void* p, size_t offset) {
  return static_cast<std::byte*>(p) + offset;
}
const std::byte* at(const void* p, size_t offset) {
  return static_cast<const std::byte*>(p) + offset;
}

// Work enqueued on the communicator's stream, done when `event` (recorded after it) is.
// Held-back point-to-point calls share one, recorded when their group is launched.
struct Completion {
  cudaEvent_t event = nullptr;
  bool launched = false;
  ~Completion() {
    if (event) (void)cudaEventDestroy(event);
  }
};

class NcclCommunicator;

class NcclRequest : public CommRequest {
 public:
  NcclRequest(NcclCommunicator* comm, std::shared_ptr<Completion> done)
      : comm_(comm), done_(std::move(done)) {}
  ~NcclRequest() override {
    // As MpiRequest: never wait for peers while the job is failing.
    if (!done_ || std::uncaught_exceptions() > 0) return;
    try {
      wait();
    } catch (...) {
    }
  }
  void wait() override;
  bool test() override;

 private:
  NcclCommunicator* comm_;
  std::shared_ptr<Completion> done_;  // null once complete
};

class DoneRequest : public CommRequest {
 public:
  void wait() override {}
  bool test() override { return true; }
};

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, std::string name) : comm_(comm), name_(std::move(name)) {
    OMNI_NCCL_CHECK(ncclCommUserRank(comm_, &rank_));
    OMNI_NCCL_CHECK(ncclCommCount(comm_, &size_));
    // A blocking stream (not cudaStreamNonBlocking): ordered with the legacy default stream,
    // where the GPU ops run when given no stream.
    OMNI_COMM_GPU_CHECK(cudaStreamCreate(&stream_));
    OMNI_COMM_GPU_CHECK(cudaMalloc(&barrier_word_, sizeof(float)));
    OMNI_COMM_GPU_CHECK(cudaMemset(barrier_word_, 0, sizeof(float)));
    blocking_.event = new_event();
    // NCCL does not tell the world ranks of a communicator's members: the watchdog names
    // the group by its name and this rank's place in it.
    watch_ = std::make_shared<WatchGroup>(name_, rank_, std::vector<int>{});
  }
  ~NcclCommunicator() override {
    if (comm_) {
      if (std::uncaught_exceptions() > 0) {
        ncclCommAbort(comm_);  // peers may never come: do not wait for them
      } else {
        try {
          flush();
          finish();
        } catch (...) {
        }
        ncclCommDestroy(comm_);
      }
    }
    if (stream_) (void)cudaStreamDestroy(stream_);
    if (barrier_word_) (void)cudaFree(barrier_word_);
    if (scratch_) (void)cudaFree(scratch_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return name_; }

  bool device_memory() const override { return true; }

  void all_reduce(void* data, size_t n, DType t, ReduceOp op) override {
    if (n == 0) return;
    CollectiveWatch watch(*watch_, "ncclAllReduce", n * dtype_size(t));
    flush();
    in_pieces(data, n, dtype_size(t), [&](void* d, size_t m) {
      OMNI_NCCL_CHECK(ncclAllReduce(d, d, m, nccl_type(t), nccl_op(op), live(), stream_));
    });
  }
  std::unique_ptr<CommRequest> iall_reduce(void* data, size_t n, DType t) override {
    if (n == 0) return std::make_unique<DoneRequest>();
    require_device(data, "iall_reduce");
    watch_->count("ncclAllReduce", n * dtype_size(t));
    flush();
    OMNI_NCCL_CHECK(ncclAllReduce(data, data, n, nccl_type(t), ncclSum, live(), stream_));
    return request_for_enqueued();
  }
  void reduce_scatter(void* out, const void* in, size_t n, DType t) override {
    if (n == 0) return;
    CollectiveWatch watch(*watch_, "ncclReduceScatter", n * size_ * dtype_size(t));
    flush();
    const size_t bytes = n * dtype_size(t);
    staged(out, bytes, in, bytes * size_, [&](void* d_out, const void* d_in) {
      OMNI_NCCL_CHECK(ncclReduceScatter(d_in, d_out, n, nccl_type(t), ncclSum, live(), stream_));
    });
  }
  std::unique_ptr<CommRequest> ireduce_scatter(void* out, const void* in, size_t n,
                                               DType t) override {
    if (n == 0) return std::make_unique<DoneRequest>();
    require_device(out, "ireduce_scatter");
    require_device(in, "ireduce_scatter");
    watch_->count("ncclReduceScatter", n * size_ * dtype_size(t));
    flush();
    OMNI_NCCL_CHECK(ncclReduceScatter(in, out, n, nccl_type(t), ncclSum, live(), stream_));
    return request_for_enqueued();
  }
  // NCCL recognises the in-place form (in == out + rank * n) itself.
  void all_gather(void* out, const void* in, size_t n, DType t) override {
    if (n == 0) return;
    CollectiveWatch watch(*watch_, "ncclAllGather", n * size_ * dtype_size(t));
    flush();
    const size_t bytes = n * dtype_size(t);
    if (on_device(out)) {
      require_device(in, "all_gather");
      OMNI_NCCL_CHECK(ncclAllGather(in, out, n, nccl_type(t), live(), stream_));
      finish();
      return;
    }
    // Host buffers: this rank's block goes to its place in the staged output, then in place.
    std::byte* d = scratch(bytes * size_);
    to_device(d + rank_ * bytes, in, bytes);
    OMNI_NCCL_CHECK(ncclAllGather(d + rank_ * bytes, d, n, nccl_type(t), live(), stream_));
    finish();
    to_host(out, d, bytes * size_);
  }
  // One group of a send and a receive per rank (itself included): NCCL progresses them
  // together, so no ordering of the pairs can deadlock.
  void all_to_all(void* out, const void* in, size_t n, DType t) override {
    if (n == 0) return;
    CollectiveWatch watch(*watch_, "ncclAllToAll", n * size_ * dtype_size(t));
    flush();
    const size_t block = n * dtype_size(t);
    staged(out, block * size_, in, block * size_, [&](void* d_out, const void* d_in) {
      OMNI_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        OMNI_NCCL_CHECK(ncclSend(at(d_in, r * block), n, nccl_type(t), r, live(), stream_));
        OMNI_NCCL_CHECK(ncclRecv(at(d_out, r * block), n, nccl_type(t), r, live(), stream_));
      }
      OMNI_NCCL_CHECK(ncclGroupEnd());
    });
  }
  // Blocks of varying size (MoE token dispatch): one group of every non-empty send and receive,
  // this rank's own block included, so NCCL progresses them together (posted one by one, two
  // ranks' large sends would each wait for a receive queued behind the other's). Host buffers
  // are staged through device memory as a whole, never copied on the host.
  void all_to_all_v(void* out, const size_t* recv_counts, const void* in, const size_t* send_counts,
                    DType t) override {
    OMNI_CHECK(send_counts[rank_] == recv_counts[rank_], "[comm ", name_, "] all_to_all_v sends ",
               send_counts[rank_], " elements to itself but receives ", recv_counts[rank_]);
    const size_t es = dtype_size(t);
    std::vector<size_t> send_at(size_ + 1, 0), recv_at(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) {
      send_at[r + 1] = send_at[r] + send_counts[r];
      recv_at[r + 1] = recv_at[r] + recv_counts[r];
    }
    const size_t in_bytes = send_at[size_] * es, out_bytes = recv_at[size_] * es;
    if (in_bytes == 0 && out_bytes == 0) return;
    CollectiveWatch watch(*watch_, "ncclSend/ncclRecv(all_to_all_v)", in_bytes + out_bytes);
    flush();
    auto run = [&](void* d_out, const void* d_in) {
      OMNI_NCCL_CHECK(ncclGroupStart());
      for (int r = 0; r < size_; ++r) {
        if (send_counts[r] > 0)
          OMNI_NCCL_CHECK(ncclSend(at(d_in, send_at[r] * es), send_counts[r], nccl_type(t), r,
                                   live(), stream_));
        if (recv_counts[r] > 0)
          OMNI_NCCL_CHECK(ncclRecv(at(d_out, recv_at[r] * es), recv_counts[r], nccl_type(t), r,
                                   live(), stream_));
      }
      OMNI_NCCL_CHECK(ncclGroupEnd());
    };
    staged(out, out_bytes, in, in_bytes, run);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    OMNI_CHECK(root >= 0 && root < size_, "[comm ", name_, "] broadcast from rank ", root, " of ",
               size_);
    if (bytes == 0) return;
    CollectiveWatch watch(*watch_, "ncclBroadcast", bytes);
    flush();
    in_pieces(data, bytes, 1, [&](void* d, size_t m) {
      OMNI_NCCL_CHECK(ncclBroadcast(d, d, m, ncclUint8, root, live(), stream_));
    });
  }
  void send(const void* data, size_t bytes, int peer, int tag) override {
    CollectiveWatch watch(*watch_, "ncclSend", bytes, peer);
    if (bytes == 0 || on_device(data)) return isend(data, bytes, peer, tag)->wait();
    std::byte* d = scratch(bytes);
    to_device(d, data, bytes);
    hold({true, d, bytes, peer})->wait();
  }
  void recv(void* data, size_t bytes, int peer, int tag) override {
    CollectiveWatch watch(*watch_, "ncclRecv", bytes, peer);
    if (bytes == 0 || on_device(data)) return irecv(data, bytes, peer, tag)->wait();
    std::byte* d = scratch(bytes);
    hold({false, d, bytes, peer})->wait();
    to_host(data, d, bytes);
  }
  std::unique_ptr<CommRequest> isend(const void* data, size_t bytes, int peer, int) override {
    if (bytes > 0) require_device(data, "isend");
    return hold({true, const_cast<void*>(data), bytes, peer});
  }
  std::unique_ptr<CommRequest> irecv(void* data, size_t bytes, int peer, int) override {
    if (bytes > 0) require_device(data, "irecv");
    return hold({false, data, bytes, peer});
  }
  // NCCL has no barrier: a one-word all-reduce that every rank must reach does the same.
  void barrier() override {
    CollectiveWatch watch(*watch_, "ncclAllReduce(barrier)", 0);
    flush();
    OMNI_NCCL_CHECK(
        ncclAllReduce(barrier_word_, barrier_word_, 1, ncclFloat32, ncclMax, live(), stream_));
    finish();
  }
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name) override {
    OMNI_CHECK(color >= 0, "[comm ", name_, "] split with negative color ", color);
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 18, 0)
    flush();
    ncclComm_t part = nullptr;
    // A null config: the part inherits this communicator's (blocking) configuration.
    OMNI_NCCL_CHECK(ncclCommSplit(live(), color, key, &part, nullptr));
    return std::make_unique<NcclCommunicator>(part, name);
#else
    (void)key;
    (void)name;
    throw InternalError("[comm " + name_ + "] split needs ncclCommSplit (NCCL 2.18 or newer); " +
                        "this build's " OMNI_NCCL_LIBRARY " is " + std::to_string(NCCL_MAJOR) +
                        "." + std::to_string(NCCL_MINOR));
#endif
  }

  // Launches the held-back point-to-point calls as one group.
  void flush() {
    if (held_.empty()) return;
    std::vector<PointToPoint> ops = std::move(held_);
    std::shared_ptr<Completion> done = std::move(held_done_);
    held_.clear();
    held_done_.reset();
    OMNI_NCCL_CHECK(ncclGroupStart());
    for (const PointToPoint& p : ops) {
      if (p.send)
        OMNI_NCCL_CHECK(ncclSend(p.data, p.bytes, ncclUint8, p.peer, live(), stream_));
      else
        OMNI_NCCL_CHECK(ncclRecv(p.data, p.bytes, ncclUint8, p.peer, live(), stream_));
    }
    OMNI_NCCL_CHECK(ncclGroupEnd());
    OMNI_COMM_GPU_CHECK(cudaEventRecord(done->event, stream_));
    done->launched = true;
  }

  // Waits on the host for `done`, watching for NCCL's asynchronous errors (a peer that
  // failed, a network error), which otherwise leave the stream waiting forever.
  void wait(Completion& done) {
    if (!done.launched) flush();
    for (;;) {
      const cudaError_t rc = cudaEventQuery(done.event);
      if (rc == cudaSuccess) return;
      if (rc != cudaErrorNotReady) OMNI_COMM_GPU_CHECK(rc);
      check_async_error();
      std::this_thread::yield();
    }
  }
  bool query(Completion& done) {
    if (!done.launched) flush();
    const cudaError_t rc = cudaEventQuery(done.event);
    if (rc == cudaSuccess) return true;
    if (rc != cudaErrorNotReady) OMNI_COMM_GPU_CHECK(rc);
    check_async_error();
    return false;
  }

 private:
  struct PointToPoint {
    bool send;
    void* data;
    size_t bytes;
    int peer;
  };

  // ---- host buffers (the blocking calls stage them through scratch_) ----

  // The non-blocking calls run while the caller computes, so they cannot copy back after;
  // the model only starts them on its own device buffers.
  void require_device(const void* p, const char* call) const {
    OMNI_CHECK(on_device(p), "[comm ", name_, "] ", call, " of ", OMNI_NCCL_LIBRARY,
               " needs a buffer in GPU memory; this one is host memory");
  }
  std::byte* scratch(size_t bytes) {
    if (bytes > scratch_bytes_) {
      if (scratch_) OMNI_COMM_GPU_CHECK(cudaFree(scratch_));  // cudaFree waits for its users
      scratch_ = nullptr, scratch_bytes_ = 0;
      OMNI_COMM_GPU_CHECK(cudaMalloc(&scratch_, bytes));
      scratch_bytes_ = bytes;
    }
    return static_cast<std::byte*>(scratch_);
  }
  void to_device(void* d, const void* h, size_t bytes) {
    OMNI_COMM_GPU_CHECK(cudaMemcpyAsync(d, h, bytes, cudaMemcpyHostToDevice, stream_));
  }
  // After finish(): the operation has completed, so this copy cannot wait on a dead peer.
  void to_host(void* h, const void* d, size_t bytes) {
    OMNI_COMM_GPU_CHECK(cudaMemcpyAsync(h, d, bytes, cudaMemcpyDeviceToHost, stream_));
    OMNI_COMM_GPU_CHECK(cudaStreamSynchronize(stream_));
  }
  // An elementwise call (`run(device_pointer, elements)`) over n elements of `elem` bytes, on
  // the buffer itself when it is device memory, else piece by piece through scratch_.
  template <typename Run>
  void in_pieces(void* data, size_t n, size_t elem, Run run) {
    if (on_device(data)) {
      run(data, n);
      finish();
      return;
    }
    const size_t piece = std::max<size_t>(1, kStagePiece / elem);
    for (size_t i = 0; i < n; i += piece) {
      const size_t m = std::min(piece, n - i);
      std::byte* d = scratch(m * elem);
      to_device(d, at(data, i * elem), m * elem);
      run(d, m);
      finish();
      to_host(at(data, i * elem), d, m * elem);
    }
  }
  // A call from `in` (in_bytes) to `out` (out_bytes, not overlapping in) as
  // `run(device_out, device_in)`, staging both when they are host memory. A side of no bytes
  // (all_to_all_v's) may be any pointer, an empty vector's null: the other side decides.
  template <typename Run>
  void staged(void* out, size_t out_bytes, const void* in, size_t in_bytes, Run run) {
    const bool device = on_device(out_bytes > 0 ? out : in);
    OMNI_CHECK(out_bytes == 0 || in_bytes == 0 || device == on_device(in), "[comm ", name_,
               "] one buffer of a collective in GPU memory and the other in host memory");
    if (device) {
      run(out, in);
      finish();
      return;
    }
    std::byte* d = scratch(out_bytes + in_bytes);
    if (in_bytes > 0) to_device(d + out_bytes, in, in_bytes);
    run(d, d + out_bytes);
    finish();
    if (out_bytes > 0) to_host(out, d, out_bytes);
  }

  std::unique_ptr<CommRequest> hold(PointToPoint p) {
    OMNI_CHECK(p.peer >= 0 && p.peer < size_, "[comm ", name_, "] point-to-point with rank ",
               p.peer, " of ", size_);
    if (p.bytes == 0) return std::make_unique<DoneRequest>();  // both sides know the size
    if (!held_done_) {
      held_done_ = std::make_shared<Completion>();
      held_done_->event = new_event();
    }
    held_.push_back(p);
    return std::make_unique<NcclRequest>(this, held_done_);
  }
  std::unique_ptr<CommRequest> request_for_enqueued() {
    auto done = std::make_shared<Completion>();
    done->event = new_event();
    OMNI_COMM_GPU_CHECK(cudaEventRecord(done->event, stream_));
    done->launched = true;
    return std::make_unique<NcclRequest>(this, std::move(done));
  }
  // Waits for everything enqueued so far (the blocking calls).
  void finish() {
    OMNI_COMM_GPU_CHECK(cudaEventRecord(blocking_.event, stream_));
    blocking_.launched = true;
    wait(blocking_);
  }
  cudaEvent_t new_event() {
    cudaEvent_t e = nullptr;
    OMNI_COMM_GPU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  ncclComm_t live() const {
    OMNI_CHECK(comm_ != nullptr, "[comm ", name_, "] used after an NCCL error aborted it");
    return comm_;
  }
  void check_async_error() {
    ncclResult_t async = ncclSuccess;
    OMNI_NCCL_CHECK(ncclCommGetAsyncError(live(), &async));
    if (async == ncclSuccess || async == ncclInProgress) return;
    std::string detail;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 13, 0)
    if (const char* last = ncclGetLastError(comm_); last && *last)
      detail = std::string(" (") + last + ")";
#endif
    ncclCommAbort(comm_);  // the communicator is unusable; free it without waiting on peers
    comm_ = nullptr;
    throw InternalError("[comm " + name_ + "] " + OMNI_NCCL_LIBRARY +
                        " failed while waiting: " + ncclGetErrorString(async) + detail +
                        "; rerun with NCCL_DEBUG=WARN for NCCL's own account");
  }

  ncclComm_t comm_;
  std::string name_;
  std::shared_ptr<WatchGroup> watch_;
  int rank_ = 0, size_ = 1;
  cudaStream_t stream_ = nullptr;
  void* barrier_word_ = nullptr;
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  Completion blocking_;
  std::vector<PointToPoint> held_;
  std::shared_ptr<Completion> held_done_;
};

void NcclRequest::wait() {
  if (!done_) return;
  comm_->wait(*done_);
  done_.reset();
}

bool NcclRequest::test() {
  if (!done_) return true;
  if (!comm_->query(*done_)) return false;
  done_.reset();
  return true;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(Communicator& host, const std::string& name) {
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  OMNI_REQUIRE(probe == cudaSuccess && devices > 0, "[comm ", name, "] ", OMNI_NCCL_LIBRARY,
               " needs a GPU on every rank, but rank ", host.rank(), " sees none (",
               probe == cudaSuccess ? "no device" : cudaGetErrorString(probe), "); check ",
               gpu_visible_devices_variable(), " and that the driver lists the GPUs");
  // One GPU per process: the launcher's local rank picks it, as torchrun and Megatron do.
  const int device = launcher_local_rank() % devices;
  check_gpu(cudaSetDevice(device), "cudaSetDevice", name);

  ncclUniqueId id{};
  if (host.rank() == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId", name, nullptr);
  host.broadcast(&id, sizeof id, 0);
  ncclComm_t comm = nullptr;
  const std::string where = "ncclCommInitRank (rank " + std::to_string(host.rank()) + " of " +
                            std::to_string(host.size()) + " on GPU " + std::to_string(device) +
                            " of " + std::to_string(devices) + ")";
  check_nccl(ncclCommInitRank(&comm, host.size(), id, host.rank()), where.c_str(), name, comm);
  return std::make_unique<NcclCommunicator>(comm, name);
}

std::string nccl_version() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return OMNI_NCCL_LIBRARY " (version unknown)";
  // NCCL_VERSION(X, Y, Z) is X*10000 + Y*100 + Z since 2.9 (X*1000 + Y*100 + Z before).
  const int major = v >= 10000 ? v / 10000 : v / 1000;
  const int minor = v >= 10000 ? (v % 10000) / 100 : (v % 1000) / 100;
  return std::string(OMNI_NCCL_LIBRARY " ") + std::to_string(major) + "." + std::to_string(minor) +
         "." + std::to_string(v % 100);
}

}  // namespace omni

#endif  // OMNITRON_NCCL
