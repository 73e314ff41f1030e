#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "backend/device.h"
#include "backend/ops.h"

extern "C" char* openblas_get_config(void);
extern "C" char* openblas_get_corename(void);

namespace omni {

void ensure_blas_environment(char** argv) {
  // Some machines preset OPENBLAS_CORETYPE=Haswell for old OpenBLAS builds; on an AVX-512
  // CPU that costs 4x in sgemm (98 vs 430 GFLOP/s measured on a 2-core EPYC). A value
  // naming any other kernel set is the user's choice and is kept, as is any value when
  // OMNITRON_KEEP_OPENBLAS_CORETYPE is set.
  const char* preset = std::getenv("OPENBLAS_CORETYPE");
  if (std::getenv("OMNITRON_KEEP_OPENBLAS_CORETYPE")) return;
  if (preset && std::string(preset) != "Haswell") return;
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512f")) return;
  setenv("OPENBLAS_CORETYPE", "SkylakeX", 1);
  setenv("OMNITRON_KEEP_OPENBLAS_CORETYPE", "1", 1);  // never loop
  execv("/proc/self/exe", argv);  // returns only on failure: carry on with the defaults
}

std::string cpu_model_name() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown CPU";
}

int cpu_threads() {
  return omp_get_max_threads();
}

std::string blas_config() {
  return std::string(openblas_get_config()) + " (kernels: " + openblas_get_corename() + ")";
}

double measure_sgemm_gflops(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  ops::gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    ops::gemm<float>(false, false, n, n, n, 1.f, a.data(), n, b.data(), n, 0.f, c.data(), n);
    best = std::min(best,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 2.0 * n * n * double(n) / best / 1e9;
}

}  // namespace omni
