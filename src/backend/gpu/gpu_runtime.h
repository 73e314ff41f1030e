// The one portability header: kernels and host code are written against these names
// and build as CUDA (nvcc) or HIP (hipcc) unchanged. Warp size comes from here, never
// a literal: 32 on NVIDIA, 64 on AMD CDNA.
#pragma once

#if defined(__HIPCC__) || defined(OMNITRON_HIP)
#include <hip/hip_runtime.h>
#define gpuError_t hipError_t
#define gpuSuccess hipSuccess
#define gpuGetDeviceCount hipGetDeviceCount
#define gpuGetErrorString hipGetErrorString
#define gpuDeviceProp hipDeviceProp_t
#define gpuGetDeviceProperties hipGetDeviceProperties
#define gpuRuntimeGetVersion hipRuntimeGetVersion
#define OMNI_GPU_RUNTIME "HIP"
#else
#include <cuda_runtime.h>
#define gpuError_t cudaError_t
#define gpuSuccess cudaSuccess
#define gpuGetDeviceCount cudaGetDeviceCount
#define gpuGetErrorString cudaGetErrorString
#define gpuDeviceProp cudaDeviceProp
#define gpuGetDeviceProperties cudaGetDeviceProperties
#define gpuRuntimeGetVersion cudaRuntimeGetVersion
#define OMNI_GPU_RUNTIME "CUDA"
#endif

#if defined(__HIP_PLATFORM_AMD__) &&                                                             \
    (defined(__gfx90a__) || defined(__gfx908__) || defined(__gfx940__) || defined(__gfx941__) || \
     defined(__gfx942__))
constexpr int kWarpSize = 64;
#else
constexpr int kWarpSize = 32;
#endif

#define OMNI_GPU_CHECK(call)                                                                   \
  do {                                                                                         \
    gpuError_t err_ = (call);                                                                  \
    if (err_ != gpuSuccess)                                                                    \
      throw ::omni::InternalError(std::string(#call) + " failed: " + gpuGetErrorString(err_) + \
                                  " at " __FILE__ ":" + std::to_string(__LINE__));             \
  } while (0)
