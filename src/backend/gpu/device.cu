// GPU discovery for `omnitron info` and --device auto. The kernels of the op surface
// arrive with the GPU backend issue; this file proves the CUDA/HIP build links.
#include <string>

#include "backend/device.h"
#include "backend/gpu/gpu_runtime.h"
#include "base/error.h"

namespace omni {

int gpu_device_count() {
  int n = 0;
  if (gpuGetDeviceCount(&n) != gpuSuccess) return 0;  // no driver or no device: no GPU
  return n;
}

std::string gpu_backend_name() {
  int v = 0;
  if (gpuRuntimeGetVersion(&v) != gpuSuccess) return std::string(OMNI_GPU_RUNTIME) + " (no driver)";
  return std::string(OMNI_GPU_RUNTIME) + " runtime " + std::to_string(v / 1000) + "." +
         std::to_string((v % 1000) / 10);
}

std::string gpu_device_name(int index) {
  gpuDeviceProp prop;
  OMNI_GPU_CHECK(gpuGetDeviceProperties(&prop, index));
  return prop.name;
}

}  // namespace omni
