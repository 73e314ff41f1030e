// The one portability header. Kernels and the host code that launches them are written
// against the names below and build unchanged three ways:
//   - CUDA (nvcc) for NVIDIA,
//   - HIP (hipcc) for AMD,
//   - plain C++ with OMNITRON_GPU_EMULATE: backend/gpu/emulator.h runs every GPU thread
//     as a fiber on the CPU, so the kernels' indexing, barriers, warp shuffles and
//     tensor-core fragments are tested against the CPU ops on any machine (CI has no GPU).
// Warp size comes from here (kWarpSize), never a literal: 32 on NVIDIA, 64 on AMD CDNA.
// Only files under backend/gpu/ include this header; the rest of the program sees
// backend/gpu/gpu_ops.h, which needs no GPU headers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "backend/gpu/gpu_types.h"
#include "base/error.h"

#if defined(OMNITRON_GPU_EMULATE)
#include "backend/gpu/emulator.h"
#elif defined(__HIPCC__) || defined(OMNITRON_HIP)
#include <hip/hip_runtime.h>
#else
#include <cuda_runtime.h>
#endif

// ---- Runtime API names ------------------------------------------------------------------
#if defined(OMNITRON_GPU_EMULATE)
#define OMNI_GPU_RUNTIME "emulated"
#elif defined(__HIPCC__) || defined(OMNITRON_HIP)
#define OMNI_GPU_RUNTIME "HIP"
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuStream_t hipStream_t
#define gpuEvent_t hipEvent_t
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetErrorString hipGetErrorString
#define gpuGetLastError hipGetLastError
#define gpuDeviceProp hipDeviceProp_t
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuRuntimeGetVersion hipRuntimeGetVersion
#define gpuDriverGetVersion hipDriverGetVersion
#define gpuSetDevice hipSetDevice
#define gpuGetDevice hipGetDevice
#define gpuMalloc hipMalloc
#define gpuFree hipFree
#define gpuMemcpy hipMemcpy
#define gpuMemcpyAsync hipMemcpyAsync
#define gpuMemcpy2DAsync hipMemcpy2DAsync
#define gpuMemset hipMemset
#define gpuMemsetAsync hipMemsetAsync
#define gpuMemcpyHostToDevice hipMemcpyHostToDevice
#define gpuMemcpyDeviceToHost hipMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice hipMemcpyDeviceToDevice
#define gpuMemcpyDefault hipMemcpyDefault
#define gpuDeviceSynchronize hipDeviceSynchronize
#define gpuStreamSynchronize hipStreamSynchronize
#define gpuStreamCreate hipStreamCreate
#define gpuStreamDestroy hipStreamDestroy
#define gpuEventCreate hipEventCreate
#define gpuEventDestroy hipEventDestroy
#define gpuEventRecord hipEventRecord
#define gpuEventSynchronize hipEventSynchronize
#define gpuEventElapsedTime hipEventElapsedTime
#define gpuMemGetInfo hipMemGetInfo
#define gpuFuncSetAttribute(f, attr, v) \
  hipFuncSetAttribute(reinterpret_cast<const void*>(f), attr, v)
#define gpuFuncAttributeMaxDynamicSharedMemorySize hipFuncAttributeMaxDynamicSharedMemorySize
#else
#define OMNI_GPU_RUNTIME "CUDA"
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuStream_t cudaStream_t
#define gpuEvent_t cudaEvent_t
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetErrorString cudaGetErrorString
#define gpuGetLastError cudaGetLastError
#define gpuDeviceProp cudaDeviceProp
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuRuntimeGetVersion cudaRuntimeGetVersion
#define gpuDriverGetVersion cudaDriverGetVersion
#define gpuSetDevice cudaSetDevice
#define gpuGetDevice cudaGetDevice
#define gpuMalloc cudaMalloc
#define gpuFree cudaFree
#define gpuMemcpy cudaMemcpy
#define gpuMemcpyAsync cudaMemcpyAsync
#define gpuMemcpy2DAsync cudaMemcpy2DAsync
#define gpuMemset cudaMemset
#define gpuMemsetAsync cudaMemsetAsync
#define gpuMemcpyHostToDevice cudaMemcpyHostToDevice
#define gpuMemcpyDeviceToHost cudaMemcpyDeviceToHost
#define gpuMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define gpuMemcpyDefault cudaMemcpyDefault
#define gpuDeviceSynchronize cudaDeviceSynchronize
#define gpuStreamSynchronize cudaStreamSynchronize
#define gpuStreamCreate cudaStreamCreate
#define gpuStreamDestroy cudaStreamDestroy
#define gpuEventCreate cudaEventCreate
#define gpuEventDestroy cudaEventDestroy
#define gpuEventRecord cudaEventRecord
#define gpuEventSynchronize cudaEventSynchronize
#define gpuEventElapsedTime cudaEventElapsedTime
#define gpuMemGetInfo cudaMemGetInfo
#define gpuFuncSetAttribute cudaFuncSetAttribute
#define gpuFuncAttributeMaxDynamicSharedMemorySize cudaFuncAttributeMaxDynamicSharedMemorySize
#endif

#define OMNI_GPU_CHECK(call)                                                                   \
  do {                                                                                         \
    gpuError_t err_ = (call);                                                                  \
    if (err_ != gpuSuccess)                                                                    \
      throw ::omni::InternalError(std::string(#call) + " failed: " + gpuGetErrorString(err_) + \
                                  " at " __FILE__ ":" + std::to_string(__LINE__));             \
  } while (0)

// ---- Warp size ----------------------------------------------------------------------------
// AMD's compiler says the wavefront size of what it compiles: 64 on CDNA (gfx90a, gfx94x) and
// in host code, which sizes launches in multiples of it; 32 in device code for RDNA.
// The emulator runs either width (emulator.h), host and device code alike.
#if defined(OMNITRON_GPU_EMULATE)
constexpr int kWarpSize = ::omni::gpu::emulator::kEmulatedWarpSize;
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
constexpr int kWarpSize = __AMDGCN_WAVEFRONT_SIZE;
#else
constexpr int kWarpSize = 32;
#endif

// Full unrolling of loops over a thread's registers (arrays indexed by the loop counter stay
// in registers only when every index is a constant). Nothing on the emulator, where g++ would
// warn about the pragma.
#if defined(OMNITRON_GPU_EMULATE)
#define OMNI_UNROLL
#else
#define OMNI_UNROLL _Pragma("unroll")
#endif

#if !defined(OMNITRON_GPU_EMULATE)
#define OMNI_HD __host__ __device__ __forceinline__
#define OMNI_DEVICE __device__ __forceinline__
// Dynamic shared memory of a kernel (the launch's shared_bytes), as bytes.
#define OMNI_DYNAMIC_SHARED(name) extern __shared__ __align__(16) unsigned char name[]
#endif

OMNI_GPU_NAMESPACE_BEGIN

// ---- Launch ---------------------------------------------------------------------------------
// launch(kernel, grid, block, shared_bytes, stream, args...) replaces <<<...>>>, which plain
// C++ cannot parse. Arguments are converted to the kernel's parameter types here.
#if !defined(OMNITRON_GPU_EMULATE)
template <typename... Params, typename... Args>
void launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
            gpuStream_t stream, Args&&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;
  kernel<<<grid, block, shared_bytes, stream>>>(static_cast<Params>(args)...);
  OMNI_GPU_CHECK(gpuGetLastError());
}
#endif

constexpr unsigned ceil_div(size_t a, size_t b) {
  return static_cast<unsigned>((a + b - 1) / b);
}

// ---- Warp collectives ------------------------------------------------------------------------
// Every lane of the warp must call these (full mask).
#if !defined(OMNITRON_GPU_EMULATE)
template <typename T>
OMNI_DEVICE T warp_shfl_xor(T v, int lane_mask) {
#if defined(__HIPCC__) || defined(OMNITRON_HIP)
  return __shfl_xor(v, lane_mask);
#else
  return __shfl_xor_sync(0xffffffffu, v, lane_mask);
#endif
}
template <typename T>
OMNI_DEVICE T warp_shfl(T v, int src_lane) {
#if defined(__HIPCC__) || defined(OMNITRON_HIP)
  return __shfl(v, src_lane);
#else
  return __shfl_sync(0xffffffffu, v, src_lane);
#endif
}
#endif

OMNI_DEVICE float warp_sum(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v += warp_shfl_xor(v, m);
  return v;
}
OMNI_DEVICE float warp_max(float v) {
  for (int m = kWarpSize / 2; m > 0; m /= 2) v = fmaxf(v, warp_shfl_xor(v, m));
  return v;
}

// Sum over a one-dimensional block (blockDim.x a multiple of kWarpSize, at most 1024), in a
// fixed order, returned to every thread. `scratch` is __shared__ float[kWarpSize] of the
// caller's; the trailing barrier lets the caller reuse it at once.
OMNI_DEVICE float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_sum(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0.0f;
  v = warp_sum(v);
  __syncthreads();
  return v;
}
OMNI_DEVICE float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  v = warp_max(v);
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : -INFINITY;
  v = warp_max(v);
  __syncthreads();
  return v;
}

// ---- Storage types ---------------------------------------------------------------------------
// bf16 and f16 and their conversions to_float / from_float<T> are base/dtype.h's (host and
// device functions): integer operations on the bits, nearest with ties to even, NaN stays NaN,
// so no vendor half-precision header is needed and the three builds agree bit for bit with the
// host code. Arithmetic is always in float.

// ---- Tensor cores ----------------------------------------------------------------------------
// c[16x8] += a[16x16] b[16x8] on one warp, T = bf16 or f16 inputs, float accumulators: PTX's
// mma.sync.m16n8k16.row.col. Fragments as PTX lays them out, with g = lane / 4, t = lane % 4
// and two elements per uint32_t (the lower index in the low half):
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8,
//   2t+9] b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g] c[0], c[1] = C[g][2t, 2t+1]   c[2], c[3]
//   = C[g+8][2t, 2t+1]
// kHasMma16816 says whether this build has it (NVIDIA sm_80+, and the emulator at 32 lanes,
// which computes it from the same layout); AMD's matrix cores have other shapes and wave size,
// so kernels take their scalar path there (if constexpr), as does the emulator at 64 lanes.
#if defined(OMNITRON_GPU_EMULATE)
constexpr bool kHasMma16816 = kWarpSize == 32;
#elif !(defined(__HIPCC__) || defined(OMNITRON_HIP))
constexpr bool kHasMma16816 = true;
#else
constexpr bool kHasMma16816 = false;
#endif

template <typename T>
OMNI_DEVICE void mma_16x8x16(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same_v<T, bf16> || std::is_same_v<T, f16>, "mma inputs are bf16 or f16");
#if defined(OMNITRON_GPU_EMULATE)
  struct Fragments {
    uint32_t a[4], b[2];
  };
  constexpr int W = emulator::kEmulatedWarpSize;
  if constexpr (W != 32) throw InternalError("mma_16x8x16 on a 64-lane wavefront (AMD has none)");
  unsigned char* slots = emulator::warp_slots();
  const int lane = emulator::ids().linear % W;
  const Fragments mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  std::memcpy(slots + lane * emulator::kSlotBytes, &mine, sizeof mine);
  emulator::sync_warp();
  auto lane_frags = [&](int l) {
    Fragments f;
    std::memcpy(&f, slots + l * emulator::kSlotBytes, sizeof f);
    return f;
  };
  auto half = [](uint32_t reg, int k) { return T{static_cast<uint16_t>(reg >> (16 * (k & 1)))}; };
  auto A = [&](int r, int k) {
    return to_float(half(lane_frags((r % 8) * 4 + (k % 8) / 2).a[(r >= 8) + 2 * (k >= 8)], k));
  };
  auto B = [&](int k, int n) {
    return to_float(half(lane_frags(n * 4 + (k % 8) / 2).b[k >= 8], k));
  };
  const int g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int r = g + 8 * (i >= 2), n = 2 * t + (i & 1);
    float s = 0.0f;
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
    c[i] += s;
  }
  emulator::sync_warp();
#elif defined(__HIPCC__) || defined(OMNITRON_HIP)
  __builtin_trap();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  if constexpr (std::is_same_v<T, bf16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// Two 16-bit elements in one register, the first in the low half (a fragment's pair).
template <typename T>
OMNI_DEVICE uint32_t pack2(T lo, T hi) {
  return uint32_t{lo.bits} | (uint32_t{hi.bits} << 16);
}

OMNI_GPU_NAMESPACE_END
