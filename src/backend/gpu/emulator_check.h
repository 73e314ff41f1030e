// The emulator's race and bounds checks (emulator.h), as the scheduler (emulator.cpp) drives
// them. Compiled only into the emulated GPU library.
//
// The kernels are compiled with GCC's ThreadSanitizer instrumentation but linked without its
// runtime: every load and store of a kernel calls __tsan_readN/__tsan_writeN, defined in
// emulator_check.cpp, which keep a shadow of the bytes of shared memory (and, in the slower
// mode, of device memory) and report conflicting accesses. Atomics call __tsan_atomic*
// instead, which only do the operation: they are exempt.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "backend/gpu/emulator.h"

namespace omni::gpu::emulator::check {

// Guard bytes on each side of dynamic shared memory, and the value they hold.
constexpr size_t kGuardBytes = 64;
constexpr unsigned char kGuardByte = 0xFD;

struct Launch {
  const void* kernel;
  std::source_location where;
  dim3 grid, block;
};

// What the checks of one launch need in every block.
struct LaunchChecks {
  Launch launch;
  bool on = false, device = false;  // device: blocks run one after the other
  std::string kernel;               // its name
  std::vector<char> allowed;        // per static __shared__ array: may the kernel touch it
  uint32_t first_epoch = 0;
};
LaunchChecks begin_launch(const Launch& launch);
// A block starts on this thread: dynamic shared memory is [dynamic, dynamic + bytes).
void begin_block(const LaunchChecks& launch, dim3 block_idx, unsigned char* dynamic, size_t bytes);
// The fiber of thread `linear` of the block runs next.
void set_thread(int linear);
// Every thread of the block passed a __syncthreads().
void block_barrier();
// The block ended; what the checks found in it ("" when nothing), guard bytes included.
std::string end_block();
// "kernel K, launched at file:line, block (x,y,z)" for the emulator's other reports.
std::string describe(const Launch& launch, dim3 block_idx);

// Device allocations (gpuMalloc, gpuFree), for the device-memory mode.
void note_alloc(void* p, size_t bytes);
void note_free(void* p);

}  // namespace omni::gpu::emulator::check
