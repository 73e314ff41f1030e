// What hardware is here, and how fast it multiplies: the figures `omnitron info` prints
// and the peak that MFU is measured against.
#pragma once

#include <string>

namespace omni {

// OpenBLAS picks its kernels when the library loads, from OPENBLAS_CORETYPE or its own
// CPU detection, which chooses a slower kernel set on some AVX-512 machines. When the
// variable is unset and the CPU has AVX-512, set it and re-execute this program, so
// users never need to know. Returns only when no re-exec was needed or it failed.
void ensure_blas_environment(char** argv);

std::string cpu_model_name();
int cpu_threads();          // OpenMP threads a parallel region uses
std::string blas_config();  // e.g. "OpenBLAS 0.3.21 ... SkylakeX MAX_THREADS=64"
// Best sgemm rate over a few n x n x n products, in GFLOP/s (the CPU's achievable peak).
double measure_sgemm_gflops(int n = 2048, int reps = 3);

// GPU devices visible to the compiled-in GPU backend (0 when built without one).
int gpu_device_count();
std::string gpu_backend_name();  // "CUDA 13.0", or "none (built without a GPU backend)"
std::string gpu_device_name(int index);

}  // namespace omni
