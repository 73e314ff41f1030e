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

void gpu_has_no_double(const char* op) {
  throw InternalError(std::string("[") + op + "] runs on the GPU in float, bf16 or f16; float64 " +
                      "runs on the CPU");
}
void cpu_has_no_16bit(const char* op) {
  throw InternalError(std::string("[") + op + "] runs on the CPU in float or float64; bf16 and " +
                      "f16 storage run on a GPU");
}

}  // namespace ops::detail

}  // namespace omni
