// The fiber scheduler behind emulator.h. Compiled only into the emulated GPU library.
//
// A fiber starts on its own stack through makecontext/setcontext; after that every switch is
// _setjmp/_longjmp, which, unlike swapcontext, saves no signal mask (two system calls per
// switch, most of the emulator's time otherwise). Jumping between stacks is what fortified
// longjmp refuses, hence no _FORTIFY_SOURCE here.
#undef _FORTIFY_SOURCE
#include "backend/gpu/emulator.h"

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "base/error.h"

namespace omni::gpu::emulator {
namespace {

enum class FiberState { Ready, AtBlockBarrier, AtWarpBarrier, Done };

// Per fiber stack; mapped once per OS thread and reused by every block it runs. Pages are
// committed only where touched.
constexpr size_t kStackBytes = 256 * 1024;

struct Fiber {
  ucontext_t start;  // the first entry only
  jmp_buf resume;
  bool started = false;
  ThreadIds ids;
  FiberState state = FiberState::Ready;
};

// One per OS thread: the block it is running.
struct BlockRunner {
  std::vector<Fiber> fibers;
  unsigned char* stacks = nullptr;
  size_t stack_count = 0;
  std::vector<unsigned char> dynamic_shared;
  std::vector<unsigned char> slots;  // warps * kEmulatedWarpSize * kSlotBytes
  jmp_buf scheduler;
  int current = -1;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;

  ~BlockRunner() {
    if (stacks) munmap(stacks, stack_count * kStackBytes);
  }
  void reserve_stacks(size_t n) {
    if (n <= stack_count) return;
    if (stacks) munmap(stacks, stack_count * kStackBytes);
    void* p = mmap(nullptr, n * kStackBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw InternalError("GPU emulator: cannot map fiber stacks");
    stacks = static_cast<unsigned char*>(p);
    stack_count = n;
  }
  Fiber& running() { return fibers[current]; }
  void suspend(FiberState why) {
    Fiber& f = running();
    f.state = why;
    if (_setjmp(f.resume) == 0) _longjmp(scheduler, 1);
  }
  // Runs fiber i until it waits or ends.
  void switch_to(int i) {
    current = i;
    Fiber& f = fibers[i];
    if (_setjmp(scheduler) != 0) return;
    if (!f.started) {
      f.started = true;
      setcontext(&f.start);
    }
    _longjmp(f.resume, 1);
  }
  void run_block(dim3 block_idx, dim3 grid, dim3 block, size_t shared_bytes);
};

thread_local BlockRunner runner;

void fiber_entry() {
  BlockRunner& r = runner;
  try {
    (*r.body)();
  } catch (...) {
    if (!r.error) r.error = std::current_exception();
  }
  r.running().state = FiberState::Done;
  _longjmp(r.scheduler, 1);
}

[[noreturn]] void fail(const dim3& b, const std::string& what) {
  throw InternalError("GPU emulator, block (" + std::to_string(b.x) + "," + std::to_string(b.y) +
                      "," + std::to_string(b.z) + "): " + what);
}

void BlockRunner::run_block(dim3 block_idx, dim3 grid, dim3 block, size_t shared_bytes) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  const int warps = (n + kEmulatedWarpSize - 1) / kEmulatedWarpSize;
  reserve_stacks(static_cast<size_t>(n));
  fibers.assign(static_cast<size_t>(n), Fiber{});
  // Poison shared memory, so reading what nobody wrote shows as garbage.
  dynamic_shared.assign(shared_bytes, 0xA5);
  slots.assign(static_cast<size_t>(warps) * kEmulatedWarpSize * kSlotBytes, 0);
  for (int i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.ids.thread_idx = dim3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
    f.ids.block_idx = block_idx;
    f.ids.block_dim = block;
    f.ids.grid_dim = grid;
    f.ids.linear = i;
    f.ids.dynamic_shared = dynamic_shared.data();
    getcontext(&f.start);
    f.start.uc_stack.ss_sp = stacks + static_cast<size_t>(i) * kStackBytes;
    f.start.uc_stack.ss_size = kStackBytes;
    f.start.uc_link = nullptr;
    makecontext(&f.start, fiber_entry, 0);
  }
  bool reverse = false;
  for (;;) {
    for (int k = 0; k < n; ++k) {
      const int i = reverse ? n - 1 - k : k;
      if (fibers[i].state != FiberState::Ready) continue;
      switch_to(i);
      if (error) std::rethrow_exception(std::exchange(error, nullptr));
    }
    reverse = !reverse;
    // Every fiber is now done or waiting. Release warps whose live lanes all wait at a
    // warp barrier, then the block if every live thread waits at the block barrier.
    bool progress = false, all_done = true, any_block_wait = false, any_done = false;
    for (int w = 0; w < warps; ++w) {
      const int lo = w * kEmulatedWarpSize, hi = std::min(n, lo + kEmulatedWarpSize);
      int waiting = 0;
      for (int i = lo; i < hi; ++i) waiting += fibers[i].state == FiberState::AtWarpBarrier;
      if (waiting > 0 && waiting < hi - lo)
        fail(block_idx, "warp " + std::to_string(w) +
                            ": a warp collective reached by only some lanes (" +
                            std::to_string(waiting) + " of " + std::to_string(hi - lo) + ")");
      if (waiting > 0) {
        for (int i = lo; i < hi; ++i) fibers[i].state = FiberState::Ready;
        progress = true;
      }
    }
    if (progress) continue;
    for (const Fiber& f : fibers) {
      all_done &= f.state == FiberState::Done;
      any_done |= f.state == FiberState::Done;
      any_block_wait |= f.state == FiberState::AtBlockBarrier;
    }
    if (all_done) return;
    if (any_block_wait && any_done)
      fail(block_idx, "a thread exited while others wait at __syncthreads()");
    for (Fiber& f : fibers) f.state = FiberState::Ready;
  }
}

}  // namespace

const ThreadIds& ids() {
  return runner.running().ids;
}

void sync_block() {
  runner.suspend(FiberState::AtBlockBarrier);
}

void sync_warp() {
  runner.suspend(FiberState::AtWarpBarrier);
}

unsigned char* warp_slots() {
  const int warp = runner.running().ids.linear / kEmulatedWarpSize;
  return runner.slots.data() + static_cast<size_t>(warp) * kEmulatedWarpSize * kSlotBytes;
}

void run_grid(dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  const size_t threads = size_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024)
    throw InternalError("GPU emulator: a block of " + std::to_string(threads) +
                        " threads (1 to 1024 allowed)");
  const long blocks = long{grid.x} * grid.y * grid.z;
  std::exception_ptr error;
  std::mutex error_mutex;
#pragma omp parallel for schedule(dynamic)
  for (long b = 0; b < blocks; ++b) {
    const dim3 block_idx(static_cast<unsigned>(b % grid.x),
                         static_cast<unsigned>((b / grid.x) % grid.y),
                         static_cast<unsigned>(b / (long{grid.x} * grid.y)));
    try {
      runner.body = &body;
      runner.run_block(block_idx, grid, block, shared_bytes);
    } catch (...) {
      const std::lock_guard lock(error_mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

}  // namespace omni::gpu::emulator

// ---- Runtime API over host memory ------------------------------------------------------------
gpuError_t gpuMalloc(void** p, size_t bytes) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *p ? gpuSuccess : 2;
}
gpuError_t gpuFree(void* p) {
  std::free(p);
  return gpuSuccess;
}
gpuError_t gpuMemcpy(void* dst, const void* src, size_t bytes, gpuMemcpyKind) {
  if (bytes) std::memmove(dst, src, bytes);
  return gpuSuccess;
}
gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind k, gpuStream_t) {
  return gpuMemcpy(dst, src, bytes, k);
}
gpuError_t gpuMemset(void* p, int value, size_t bytes) {
  if (bytes) std::memset(p, value, bytes);
  return gpuSuccess;
}
gpuError_t gpuMemsetAsync(void* p, int value, size_t bytes, gpuStream_t) {
  return gpuMemset(p, value, bytes);
}
gpuError_t gpuDeviceSynchronize() {
  return gpuSuccess;
}
gpuError_t gpuStreamSynchronize(gpuStream_t) {
  return gpuSuccess;
}
gpuError_t gpuStreamCreate(gpuStream_t* s) {
  *s = nullptr;
  return gpuSuccess;
}
gpuError_t gpuStreamDestroy(gpuStream_t) {
  return gpuSuccess;
}
gpuError_t gpuEventCreate(gpuEvent_t* e) {
  *e = new gpuEventRecordTime{};
  return gpuSuccess;
}
gpuError_t gpuEventDestroy(gpuEvent_t e) {
  delete e;
  return gpuSuccess;
}
gpuError_t gpuEventRecord(gpuEvent_t e, gpuStream_t) {
  e->t = std::chrono::steady_clock::now();
  return gpuSuccess;
}
gpuError_t gpuEventSynchronize(gpuEvent_t) {
  return gpuSuccess;
}
gpuError_t gpuEventElapsedTime(float* ms, gpuEvent_t start, gpuEvent_t end) {
  *ms = std::chrono::duration<float, std::milli>(end->t - start->t).count();
  return gpuSuccess;
}
gpuError_t gpuGetLastError() {
  return gpuSuccess;
}
gpuError_t gpuGetDeviceCount(int* n) {
  *n = 1;
  return gpuSuccess;
}
gpuError_t gpuSetDevice(int) {
  return gpuSuccess;
}
gpuError_t gpuGetDevice(int* d) {
  *d = 0;
  return gpuSuccess;
}
gpuError_t gpuGetDeviceProperties(gpuDeviceProp* prop, int) {
  *prop = gpuDeviceProp{};
  std::strncpy(prop->name, "GPU emulated on the CPU", sizeof(prop->name) - 1);
  prop->multiProcessorCount = 2;
  prop->totalGlobalMem = size_t{1} << 33;
  prop->sharedMemPerBlockOptin = 227 * 1024;
  prop->major = 9;
  return gpuSuccess;
}
gpuError_t gpuMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *free_bytes = *total_bytes = size_t{1} << 33;
  return gpuSuccess;
}
gpuError_t gpuRuntimeGetVersion(int* v) {
  *v = 0;
  return gpuSuccess;
}
const char* gpuGetErrorString(gpuError_t e) {
  return e == gpuSuccess ? "no error" : "out of memory (emulated device)";
}
