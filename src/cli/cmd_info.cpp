#include <cstdio>

#include "backend/device.h"
#include "cli/commands.h"

namespace omni::cli {

int info(const std::vector<std::string>&) {
  std::printf("cpu:          %s, %d threads\n", cpu_model_name().c_str(), cpu_threads());
  std::printf("blas:         %s\n", blas_config().c_str());
  std::printf("sgemm peak:   %.0f GFLOP/s (measured now; MFU on the CPU is against this)\n",
              measure_sgemm_gflops());
  std::printf("gpu backend:  %s\n", gpu_backend_name().c_str());
  const int n = gpu_device_count();
  std::printf("gpu devices:  %d\n", n);
  for (int i = 0; i < n; ++i) std::printf("  %d: %s\n", i, gpu_device_name(i).c_str());
#ifdef OMNITRON_MPI
  std::printf("collectives:  MPI (compiled in)\n");
#else
  std::printf("collectives:  none (built without OMNITRON_MPI)\n");
#endif
  return 0;
}

}  // namespace omni::cli
