// GPU discovery for `omnitron info` and --device (backend/device.cpp decides; this file asks
// the runtime). Built as CUDA or HIP with the GPU backend, never on the emulator.
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

std::string gpu_probe_error() {
  int n = 0;
  const gpuError_t rc = gpuGetDeviceCount(&n);
  if (rc != gpuSuccess) return gpuGetErrorString(rc);
  return n > 0 ? "" : "the runtime found no device";
}

std::string gpu_backend_name() {
  // Versions are 1000 * major + 10 * minor; the driver's is 0 when none is installed.
  const auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
  };
  int runtime = 0, driver = 0;
  std::string s = std::string(OMNI_GPU_RUNTIME) + " runtime ";
  s += gpuRuntimeGetVersion(&runtime) == gpuSuccess ? version(runtime) : "(version unknown)";
  s += gpuDriverGetVersion(&driver) == gpuSuccess && driver > 0 ? ", driver " + version(driver)
                                                                : ", no driver found";
  return s;
}

std::string gpu_device_name(int index) {
  return gpu_device_info(index).name;
}

void use_gpu(int index) {
  OMNI_GPU_CHECK(gpuSetDevice(index));
}

GpuDeviceInfo gpu_device_info(int index) {
  gpuDeviceProp prop;
  OMNI_GPU_CHECK(gpuGetDeviceProperties(&prop, index));
  GpuDeviceInfo info;
  info.name = prop.name;
  info.memory_bytes = prop.totalGlobalMem;
  info.multiprocessors = prop.multiProcessorCount;
#if defined(__HIPCC__) || defined(OMNITRON_HIP)
  info.architecture = prop.gcnArchName;
#else
  info.architecture =
      "compute capability " + std::to_string(prop.major) + "." + std::to_string(prop.minor);
#endif
  return info;
}

}  // namespace omni
