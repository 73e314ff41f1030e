// Linked into builds without a GPU backend: GPU queries answer "none".
#include "backend/device.h"
#include "base/error.h"

namespace omni {

namespace {
[[noreturn]] void no_gpu_backend() {
  throw UsageError(
      "this omnitron was built without a GPU backend (rebuild with -DOMNITRON_CUDA=ON "
      "or -DOMNITRON_HIP=ON)");
}
}  // namespace

int gpu_device_count() {
  return 0;
}
std::string gpu_probe_error() {
  return "";
}
std::string gpu_backend_name() {
  return "none (built without OMNITRON_CUDA or OMNITRON_HIP)";
}
std::string gpu_device_name(int) {
  no_gpu_backend();
}
GpuDeviceInfo gpu_device_info(int) {
  no_gpu_backend();
}
void use_gpu(int) {
  no_gpu_backend();
}

}  // namespace omni
