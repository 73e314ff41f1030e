// The GPU execution model on the CPU, so every kernel of backend/gpu/ is tested against the
// CPU ops on machines without a GPU (CI). Included by gpu_runtime.h when OMNITRON_GPU_EMULATE
// is defined; the kernels' source is unchanged.
//
// Each GPU thread of a block is a fiber (ucontext) with its own stack; one OS thread runs a
// whole block, switching fibers at barriers, and blocks run in parallel over OpenMP threads.
//   - __syncthreads() suspends a fiber until every live thread of its block has arrived; a
//     thread that exits while others wait at a barrier is reported as an error (undefined
//     behaviour on a GPU), as is a barrier nobody can pass (deadlock).
//   - Warp collectives (shuffles, the tensor-core mma) exchange values through per-warp
//     slots between two warp barriers; lanes of one warp reaching different barriers, or a
//     lane missing, are reported.
//   - Between barriers, fibers run in alternating forward and reverse order, so a missing
//     barrier shows as a wrong result instead of hiding behind one lucky order.
//   - __shared__ variables are function-local `static thread_local`: one copy per OS thread,
//     i.e. per block in flight; dynamic shared memory has guard bytes on both sides, checked at
//     the end of each block. Device memory is host memory, allocated to the byte (so an
//     AddressSanitizer build sees every out-of-bounds access of a kernel).
//   - Checks (emulator_check.cpp), on by default: every access of a kernel to shared memory goes
//     through shadow state, which reports, with the kernel, block, both threads and the address,
//     a write and a read or write of the same bytes by two threads with no __syncthreads()
//     between them, a read of shared memory no thread of the block has written, and an access
//     outside the shared arrays (atomics are exempt). A slower mode shadows device memory too
//     (races between threads of a launch). The environment variable OMNI_EMULATOR_CHECKS
//     (off, shared, device) or set_checks() chooses.
// Nothing here is fast: it is for small shapes in tests.
#pragma once

#include <omp.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <source_location>
#include <tuple>
#include <type_traits>
#include <utility>

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace omni::gpu::emulator {

struct ThreadIds {
  dim3 thread_idx, block_idx, block_dim, grid_dim;
  int linear;  // x + y * Dx + z * Dx * Dy, as CUDA numbers lanes and warps
  unsigned char* dynamic_shared;
};
// The running fiber's ids (valid only inside a kernel).
const ThreadIds& ids();
// The warp size the emulator runs with, chosen per build: 32 (NVIDIA's warp) or 64 (AMD CDNA's
// wavefront; gpu_runtime.h then takes the code paths hipcc compiles for gfx90a/gfx940).
#if !defined(OMNITRON_EMULATED_WARP_SIZE)
#define OMNITRON_EMULATED_WARP_SIZE 32
#endif
constexpr int kEmulatedWarpSize = OMNITRON_EMULATED_WARP_SIZE;
static_assert(kEmulatedWarpSize == 32 || kEmulatedWarpSize == 64, "warps of 32 or 64 lanes");

void sync_block();
void sync_warp();
// Bytes a lane may deposit per warp exchange.
constexpr size_t kSlotBytes = 64;
// The calling warp's exchange slots: kEmulatedWarpSize slots of kSlotBytes each.
unsigned char* warp_slots();

enum class Checks { Off, Shared, SharedAndDevice };
// The checks of the launches that follow (the default comes from OMNI_EMULATOR_CHECKS: off,
// shared or device; shared when unset). Kernels compiled without the access hooks (the
// sanitizer build) are not checked.
void set_checks(Checks checks);
Checks checks();

// A launch's grid and where the launch is in the source, for the checks' reports.
struct LaunchGrid {
  dim3 grid;
  std::source_location where;
  template <typename G>
  requires std::is_constructible_v<dim3, G> LaunchGrid(
      G g, std::source_location where_ = std::source_location::current())
      : grid(dim3(g)), where(where_) {}
};

// Runs body() once per thread of every block of the grid; kernel names the launched function
// in reports.
void run_grid(const LaunchGrid& grid, dim3 block, size_t shared_bytes,
              const std::function<void()>& body, const void* kernel);

}  // namespace omni::gpu::emulator

#define threadIdx (::omni::gpu::emulator::ids().thread_idx)
#define blockIdx (::omni::gpu::emulator::ids().block_idx)
#define blockDim (::omni::gpu::emulator::ids().block_dim)
#define gridDim (::omni::gpu::emulator::ids().grid_dim)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static thread_local
#define __launch_bounds__(...)
#define __syncthreads() ::omni::gpu::emulator::sync_block()
#define __syncwarp() ::omni::gpu::emulator::sync_warp()
#define OMNI_HD inline
#define OMNI_DEVICE inline
#define OMNI_DYNAMIC_SHARED(name) unsigned char* name = ::omni::gpu::emulator::ids().dynamic_shared

// ---- The runtime API subset the backend uses, over host memory ---------------------------
using gpuError_t = int;
constexpr gpuError_t gpuSuccess = 0;
using gpuStream_t = void*;
enum gpuMemcpyKind {
  gpuMemcpyHostToDevice,
  gpuMemcpyDeviceToHost,
  gpuMemcpyDeviceToDevice,
  gpuMemcpyDefault
};
struct gpuEventRecordTime {
  std::chrono::steady_clock::time_point t;
};
using gpuEvent_t = gpuEventRecordTime*;
struct gpuDeviceProp {
  char name[256];
  int multiProcessorCount;
  size_t totalGlobalMem;
  size_t sharedMemPerBlockOptin;
  int major, minor;
};
enum gpuFuncAttribute { gpuFuncAttributeMaxDynamicSharedMemorySize };

gpuError_t gpuMalloc(void** p, size_t bytes);
template <typename T>
gpuError_t gpuMalloc(T** p, size_t bytes) {
  return gpuMalloc(reinterpret_cast<void**>(p), bytes);
}
gpuError_t gpuFree(void* p);
gpuError_t gpuMemcpy(void* dst, const void* src, size_t bytes, gpuMemcpyKind);
gpuError_t gpuMemcpyAsync(void* dst, const void* src, size_t bytes, gpuMemcpyKind, gpuStream_t);
gpuError_t gpuMemcpy2DAsync(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                            size_t width, size_t height, gpuMemcpyKind, gpuStream_t);
gpuError_t gpuMemset(void* p, int value, size_t bytes);
gpuError_t gpuMemsetAsync(void* p, int value, size_t bytes, gpuStream_t);
gpuError_t gpuDeviceSynchronize();
gpuError_t gpuStreamSynchronize(gpuStream_t);
gpuError_t gpuStreamCreate(gpuStream_t* s);
gpuError_t gpuStreamDestroy(gpuStream_t s);
gpuError_t gpuEventCreate(gpuEvent_t* e);
gpuError_t gpuEventDestroy(gpuEvent_t e);
gpuError_t gpuEventRecord(gpuEvent_t e, gpuStream_t s = nullptr);
gpuError_t gpuEventSynchronize(gpuEvent_t e);
gpuError_t gpuEventElapsedTime(float* ms, gpuEvent_t start, gpuEvent_t end);
gpuError_t gpuGetLastError();
gpuError_t gpuGetDeviceCount(int* n);
gpuError_t gpuSetDevice(int d);
gpuError_t gpuGetDevice(int* d);
gpuError_t gpuGetDeviceProperties(gpuDeviceProp* prop, int d);
gpuError_t gpuMemGetInfo(size_t* free_bytes, size_t* total_bytes);
gpuError_t gpuRuntimeGetVersion(int* v);
const char* gpuGetErrorString(gpuError_t e);
template <typename F>
gpuError_t gpuFuncSetAttribute(F, gpuFuncAttribute, int) {
  return gpuSuccess;
}

// ---- Device intrinsics ---------------------------------------------------------------------
inline float __expf(float x) {
  return std::exp(x);
}
inline float __logf(float x) {
  return std::log(x);
}
inline float rsqrtf(float x) {
  return 1.0f / std::sqrt(x);
}
inline float __fdividef(float a, float b) {
  return a / b;
}
inline float __frcp_rn(float x) {
  return 1.0f / x;
}
template <typename T>
T __ldg(const T* p) {
  return *p;
}
inline float atomicAdd(float* p, float v) {
  return std::atomic_ref<float>(*p).fetch_add(v);
}
inline double atomicAdd(double* p, double v) {
  return std::atomic_ref<double>(*p).fetch_add(v);
}
inline int atomicAdd(int* p, int v) {
  return std::atomic_ref<int>(*p).fetch_add(v);
}
inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return std::atomic_ref<unsigned>(*p).fetch_add(v);
}
inline int atomicMax(int* p, int v) {
  std::atomic_ref<int> a(*p);
  int old = a.load();
  while (old < v && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

namespace omni::gpu {
inline namespace emulated {

template <typename T>
T warp_exchange(T v, int src_lane) {
  static_assert(sizeof(T) <= emulator::kSlotBytes);
  unsigned char* slots = emulator::warp_slots();
  const int lane = emulator::ids().linear % emulator::kEmulatedWarpSize;
  std::memcpy(slots + lane * emulator::kSlotBytes, &v, sizeof(T));
  emulator::sync_warp();
  T r;
  std::memcpy(&r, slots + src_lane * emulator::kSlotBytes, sizeof(T));
  emulator::sync_warp();
  return r;
}
template <typename T>
T warp_shfl_xor(T v, int lane_mask) {
  return warp_exchange(v, (emulator::ids().linear % emulator::kEmulatedWarpSize) ^ lane_mask);
}
template <typename T>
T warp_shfl(T v, int src_lane) {
  return warp_exchange(v, src_lane);
}

template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), emulator::LaunchGrid grid, dim3 block, size_t shared_bytes,
            gpuStream_t, Args&&... args) {
  if (grid.grid.x == 0 || grid.grid.y == 0 || grid.grid.z == 0) return;
  const std::tuple<Params...> params(static_cast<Params>(args)...);
  emulator::run_grid(
      grid, block, shared_bytes, [&] { std::apply(kernel, params); },
      reinterpret_cast<const void*>(kernel));
}

}  // namespace emulated
}  // namespace omni::gpu
