// The fiber scheduler behind emulator.h. Compiled only into the emulated GPU library.
//
// A fiber starts on its own stack through makecontext/setcontext; after that every switch is
// _setjmp/_longjmp, which, unlike swapcontext, saves no signal mask (two system calls per
// switch, most of the emulator's time otherwise). Jumping between stacks is what fortified
// longjmp refuses, hence no _FORTIFY_SOURCE here.
#undef _FORTIFY_SOURCE
#include "backend/gpu/emulator.h"

#include <setjmp.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backend/gpu/emulator_check.h"
#include "base/error.h"

// AddressSanitizer must be told when execution moves to another stack.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define OMNI_START_SWITCH(save, bottom, size) __sanitizer_start_switch_fiber(save, bottom, size)
#define OMNI_FINISH_SWITCH(save, bottom, size) __sanitizer_finish_switch_fiber(save, bottom, size)
#define OMNI_POISON(p, n) __asan_poison_memory_region(p, n)
#define OMNI_UNPOISON(p, n) __asan_unpoison_memory_region(p, n)
#else
#define OMNI_START_SWITCH(save, bottom, size)
#define OMNI_FINISH_SWITCH(save, bottom, size)
#define OMNI_POISON(p, n)
#define OMNI_UNPOISON(p, n)
#endif

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
  void* fake_stack = nullptr;  // AddressSanitizer's, while switched out
};

// One per OS thread: the block it is running.
struct BlockRunner {
  std::vector<Fiber> fibers;
  unsigned char* stacks = nullptr;
  size_t stack_count = 0;
  std::vector<unsigned char> dynamic_shared;  // guard bytes on both sides
  std::vector<unsigned char> slots;           // warps * kEmulatedWarpSize * kSlotBytes
  jmp_buf scheduler;
  int current = -1;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
  const check::LaunchChecks* launch = nullptr;
  void* scheduler_fake_stack = nullptr;
  const void* scheduler_stack = nullptr;
  size_t scheduler_stack_bytes = 0;

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
    if (_setjmp(f.resume) == 0) {
      OMNI_START_SWITCH(&f.fake_stack, scheduler_stack, scheduler_stack_bytes);
      _longjmp(scheduler, 1);
    }
    OMNI_FINISH_SWITCH(f.fake_stack, nullptr, nullptr);
  }
  // Runs fiber i until it waits or ends.
  [[gnu::noinline]] void switch_to(int i) {  // its _setjmp apart from run_block's locals
    current = i;
    check::set_thread(i);
    Fiber& f = fibers[i];
    if (_setjmp(scheduler) != 0) {
      OMNI_FINISH_SWITCH(scheduler_fake_stack, nullptr, nullptr);
      return;
    }
    OMNI_START_SWITCH(&scheduler_fake_stack, stacks + static_cast<size_t>(i) * kStackBytes,
                      kStackBytes);
    if (!f.started) {
      f.started = true;
      setcontext(&f.start);
    }
    _longjmp(f.resume, 1);
  }
  void run_block(dim3 block_idx, dim3 grid, dim3 block, size_t shared_bytes);
  [[noreturn]] void fail(const dim3& b, const std::string& what) const {
    throw InternalError("GPU emulator, " + check::describe(launch->launch, b) + ": " + what);
  }
  std::string check_guards() const;
};

thread_local BlockRunner runner;

void fiber_entry() {
  BlockRunner& r = runner;
  OMNI_FINISH_SWITCH(nullptr, &r.scheduler_stack, &r.scheduler_stack_bytes);
  try {
    (*r.body)();
  } catch (...) {
    if (!r.error) r.error = std::current_exception();
  }
  r.running().state = FiberState::Done;
  OMNI_START_SWITCH(nullptr, r.scheduler_stack, r.scheduler_stack_bytes);
  _longjmp(r.scheduler, 1);
}

// A context entering fiber_entry on the given stack (apart from run_block: getcontext
// returns twice, as far as the compiler knows).
[[gnu::noinline]] void prepare_start(ucontext_t& start, unsigned char* stack) {
  getcontext(&start);
  start.uc_stack.ss_sp = stack;
  start.uc_stack.ss_size = kStackBytes;
  start.uc_link = nullptr;
  makecontext(&start, fiber_entry, 0);
}

std::string BlockRunner::check_guards() const {
  const size_t bytes = dynamic_shared.size() - 2 * check::kGuardBytes;
  const unsigned char* data = dynamic_shared.data() + check::kGuardBytes;
  for (long i = -long{check::kGuardBytes}; i < long{check::kGuardBytes}; ++i) {
    const unsigned char* p = i < 0 ? data + i : data + bytes + i;
    if (*p != check::kGuardByte)
      return "out of bounds: the guard byte at offset " +
             std::to_string(i < 0 ? i : static_cast<long>(bytes) + i) +
             " of dynamic shared memory (" + std::to_string(bytes) + " bytes) was overwritten";
  }
  return "";
}

void BlockRunner::run_block(dim3 block_idx, dim3 grid, dim3 block, size_t shared_bytes) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  const int warps = (n + kEmulatedWarpSize - 1) / kEmulatedWarpSize;
  reserve_stacks(static_cast<size_t>(n));
  fibers.assign(static_cast<size_t>(n), Fiber{});
  // Poison shared memory, so reading what nobody wrote shows as garbage; guard bytes around.
  constexpr size_t G = check::kGuardBytes;
  OMNI_UNPOISON(dynamic_shared.data(), dynamic_shared.size());
  dynamic_shared.assign(shared_bytes + 2 * G, check::kGuardByte);
  std::memset(dynamic_shared.data() + G, 0xA5, shared_bytes);
  unsigned char* dynamic = dynamic_shared.data() + G;
  OMNI_POISON(dynamic - G, G);
  OMNI_POISON(dynamic + shared_bytes, G);
  slots.assign(static_cast<size_t>(warps) * kEmulatedWarpSize * kSlotBytes, 0);
  for (int i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.ids.thread_idx = dim3(i % block.x, (i / block.x) % block.y, i / (block.x * block.y));
    f.ids.block_idx = block_idx;
    f.ids.block_dim = block;
    f.ids.grid_dim = grid;
    f.ids.linear = i;
    f.ids.dynamic_shared = dynamic;
    prepare_start(f.start, stacks + static_cast<size_t>(i) * kStackBytes);
  }
  check::begin_block(*launch, block_idx, dynamic, shared_bytes);
  struct EndChecks {  // also when the block fails
    BlockRunner& r;
    ~EndChecks() {
      check::end_block();
      OMNI_UNPOISON(r.dynamic_shared.data(), r.dynamic_shared.size());
    }
  } end_checks{*this};
  bool reverse = false;
  for (;;) {
    for (int k = 0; k < n; ++k) {
      const int i = reverse ? n - 1 - k : k;
      if (fibers[i].state != FiberState::Ready) continue;
      switch_to(i);
      if (error) {
        const std::string found = check::end_block();
        if (!found.empty()) fail(block_idx, found);  // the cause, likely
        std::rethrow_exception(std::exchange(error, nullptr));
      }
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
    if (all_done) {
      std::string found = check::end_block();
      OMNI_UNPOISON(dynamic_shared.data(), dynamic_shared.size());
      if (found.empty()) found = check_guards();
      if (!found.empty()) fail(block_idx, found);
      return;
    }
    if (any_block_wait && any_done)
      fail(block_idx, "a thread exited while others wait at __syncthreads()");
    for (Fiber& f : fibers) f.state = FiberState::Ready;
    check::block_barrier();
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

void run_grid(const LaunchGrid& launch_grid, dim3 block, size_t shared_bytes,
              const std::function<void()>& body, const void* kernel) {
  const dim3 grid = launch_grid.grid;
  const check::LaunchChecks launch = check::begin_launch({kernel, launch_grid.where, grid, block});
  const size_t threads = size_t{block.x} * block.y * block.z;
  if (threads == 0 || threads > 1024)
    throw InternalError("GPU emulator: a block of " + std::to_string(threads) +
                        " threads (1 to 1024 allowed), " +
                        check::describe(launch.launch, dim3(0, 0, 0)));
  const long blocks = long{grid.x} * grid.y * grid.z;
  std::exception_ptr error;
  std::mutex error_mutex;
  // Shadowed device memory is one state: its blocks run one after the other.
#pragma omp parallel for schedule(dynamic) if (!launch.device)
  for (long b = 0; b < blocks; ++b) {
    const dim3 block_idx(static_cast<unsigned>(b % grid.x),
                         static_cast<unsigned>((b / grid.x) % grid.y),
                         static_cast<unsigned>(b / (long{grid.x} * grid.y)));
    try {
      runner.body = &body;
      runner.launch = &launch;
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
// To the byte: an access past the end is outside the allocation (AddressSanitizer sees it).
gpuError_t gpuMalloc(void** p, size_t bytes) {
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return 2;
  omni::gpu::emulator::check::note_alloc(*p, bytes);
  return gpuSuccess;
}
gpuError_t gpuFree(void* p) {
  if (!p) return gpuSuccess;
  omni::gpu::emulator::check::note_free(p);
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
gpuError_t gpuMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                            size_t width, size_t height, gpuMemcpyKind k, gpuStream_t) {
  for (size_t r = 0; r < height; ++r)
    gpuMemcpy(static_cast<char*>(dst) + r * dst_pitch,
              static_cast<const char*>(src) + r * src_pitch, width, k);
  return gpuSuccess;
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
// Emulated devices share the host's memory; what differs per device is its scratch space
// (memory.cu), so that ranks running in threads of one process (the in-process layout tests)
// each use their own, as processes with one GPU each do. The current device is per thread, as
// CUDA's is.
constexpr int kEmulatedDevices = 8;
thread_local int t_device = 0;

gpuError_t gpuGetDeviceCount(int* n) {
  *n = kEmulatedDevices;
  return gpuSuccess;
}
gpuError_t gpuSetDevice(int d) {
  if (d < 0 || d >= kEmulatedDevices) return 101;  // cudaErrorInvalidDevice
  t_device = d;
  return gpuSuccess;
}
gpuError_t gpuGetDevice(int* d) {
  *d = t_device;
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
  return e == gpuSuccess ? "no error"
         : e == 101     ? "invalid device ordinal (emulated device)"
                        : "out of memory (emulated device)";
}
