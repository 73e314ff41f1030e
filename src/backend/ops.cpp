#include "backend/ops.h"

#include <string>

#include "base/error.h"

#if defined(OMNITRON_GPU)
#include "backend/gpu/gpu_ops.h"
#endif

namespace omni {

namespace {
const GpuBackend* installed_backend() {
#if defined(OMNITRON_GPU)
  return &gpu::device::backend();
#else
  return nullptr;
#endif
}
const GpuBackend* g_backend = installed_backend();
}  // namespace

const GpuBackend* gpu_backend() {
  return g_backend;
}
void set_gpu_backend(const GpuBackend* backend) {
  g_backend = backend;
}

namespace ops::detail {

void gpu_needs_float(const char* op) {
  throw InternalError(std::string("[") + op +
                      "] runs on the GPU with float storage; float64 runs on the CPU");
}

}  // namespace ops::detail

}  // namespace omni
