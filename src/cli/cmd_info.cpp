#include <cstdio>
#include <string>

#include "backend/cpu/gemm.h"
#include "backend/device.h"
#include "backend/device_selection.h"
#include "cli/commands.h"

#if defined(OMNITRON_MPI)
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#endif
#if defined(OMNITRON_NCCL)
#include "comm/nccl_communicator.h"
#endif

namespace omni::cli {

namespace {

#if defined(OMNITRON_MPI)
// "Open MPI v4.1.6", "MPICH Version: 4.1.2": the library's own first words (callable before
// MPI_Init), then the standard it implements.
std::string mpi_version() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0, major = 0, minor = 0;
  MPI_Get_library_version(text, &len);
  MPI_Get_version(&major, &minor);
  std::string s(text, len > 0 ? size_t(len) : 0);
  s = s.substr(0, s.find_first_of(",\n"));
  for (char& c : s)
    if (c == '\t') c = ' ';
  return s + " (MPI " + std::to_string(major) + "." + std::to_string(minor) + ")";
}
#endif

std::string collectives() {
  std::string s;
#if defined(OMNITRON_MPI)
  s = "MPI: " + mpi_version();
#else
  s = "MPI: none (built without OMNITRON_MPI)";
#endif
#if defined(OMNITRON_NCCL)
  s += "; " + nccl_version();
#elif defined(OMNITRON_GPU)
  s += "; NCCL/RCCL: none (built without OMNITRON_NCCL)";
#endif
  return s;
}

}  // namespace

int info(const std::vector<std::string>&) {
  std::printf("cpu:          %s, %d threads (idle OpenMP threads wait: %s)\n",
              cpu_model_name().c_str(), cpu_threads(), openmp_wait_policy().c_str());
  std::printf("blas:         %s\n", blas_config().c_str());
  std::printf("sgemm peak:   %.0f GFLOP/s, %s (measured now; MFU on the CPU is against this)\n",
              measure_gemm_gflops(), ops::describe_cpu_fp32_gemm().c_str());
  {
    ops::CpuBf16Gemms bf16_gemms;  // --bf16's GEMMs on the CPU (backend/cpu/gemm.h)
    const double bf16_peak = measure_gemm_gflops();
    std::printf("bf16 GEMM:    %.0f GFLOP/s, %s (measured now; MFU under --bf16 on the CPU)\n",
                bf16_peak, ops::describe_cpu_bf16_gemm().c_str());
  }
  std::printf("gpu backend:  %s\n", gpu_backend_name().c_str());
  const GpuAvailability gpus = gpu_availability();
  const std::string visible =
      std::string(gpu_visible_devices_variable()) +
      (gpus.visible_devices == "unset" ? " unset" : "='" + gpus.visible_devices + "'");
  if (gpus.backend != DeviceKind::CPU && gpus.devices == 0)
    std::printf("gpu devices:  none visible (%s; %s)\n", gpus.probe_error.c_str(), visible.c_str());
  else if (gpus.backend != DeviceKind::CPU)
    std::printf("gpu devices:  %d (%s)\n", gpus.devices, visible.c_str());
  const char* units = gpus.backend == DeviceKind::HIP ? "CUs" : "SMs";
  for (int i = 0; i < gpus.devices; ++i) {
    const GpuDeviceInfo d = gpu_device_info(i);
    const double peak = gpu_peak_bf16_tflops(d.name);
    const std::string peak_text =
        peak > 0 ? "bf16 peak " + std::to_string(int(peak)) + " TFLOP/s (MFU is against this)"
                 : "bf16 peak unknown (not in omnitron's table: no MFU on this GPU)";
    std::printf("  %d: %s, %.1f GiB, %d %s, %s; %s\n", i, d.name.c_str(),
                double(d.memory_bytes) / (1024.0 * 1024.0 * 1024.0), d.multiprocessors, units,
                d.architecture.c_str(), peak_text.c_str());
  }
  std::printf("collectives:  %s\n", collectives().c_str());
  std::printf("device auto:  %s\n", resolve_device("auto").device.str().c_str());
  return 0;
}

}  // namespace omni::cli
