// What hardware is here, and how fast it multiplies: the figures `omnitron info` prints,
// the peak that MFU is measured against, and which device --device names.
#pragma once

#include <cstddef>
#include <string>

namespace omni {

// The CPU runtime's settings that are read when its libraries load, set before they are:
// OpenBLAS picks its kernels from OPENBLAS_CORETYPE or its own CPU detection, which chooses
// a slower kernel set on some AVX-512 machines; libgomp reads how idle threads wait
// (OMP_WAIT_POLICY), where its spinning default slows small models by orders of magnitude
// on a busy machine, and how many threads to start (OMP_NUM_THREADS: each rank of an
// oversubscribed or unbound node its share of the cores). When the user left them unset, set
// them (SkylakeX kernels on an AVX-512 CPU, passive waiting) and re-execute this program, so
// users never need to know.
// Returns only when no re-exec was needed or it failed.
void ensure_runtime_environment(char** argv);
// How idle OpenMP threads wait: "passive", "active", "GOMP_SPINCOUNT=N" or libgomp's default.
std::string openmp_wait_policy();

std::string cpu_model_name();
int cpu_threads();          // OpenMP threads a parallel region uses
// Why ensure_runtime_environment chose cpu_threads() ("2 cores shared by 4 ranks on this
// node"), or "" when the launcher's binding or the user's OMP_NUM_THREADS did.
std::string cpu_threads_reason();
std::string blas_config();  // e.g. "OpenBLAS 0.3.21 ... SkylakeX MAX_THREADS=64"
// Best rate of ops::gemm<float> over a few n x n x n products, in GFLOP/s (the CPU's
// achievable peak): the fp32 GEMM's, or under an ops::CpuBf16Gemms scope the bf16 GEMM's.
double measure_gemm_gflops(int n = 2048, int reps = 3);

// ---- GPUs (backend/gpu/device.cu in a GPU build, backend/gpu/no_gpu.cpp otherwise) ----

// GPU devices visible to the compiled-in GPU backend (0 when built without one, or when the
// runtime finds no device or no usable driver).
int gpu_device_count();
// Why gpu_device_count() is 0 in a GPU build, in the runtime's words ("no CUDA-capable device
// is detected", "CUDA driver version is insufficient for CUDA runtime version"); empty when
// devices were found or the build has no GPU backend.
std::string gpu_probe_error();
// "CUDA runtime 13.0, driver 12.8", or "none (built without ...)".
std::string gpu_backend_name();
std::string gpu_device_name(int index);

struct GpuDeviceInfo {
  std::string name;          // "NVIDIA H100 80GB HBM3"
  size_t memory_bytes = 0;   // total device memory
  int multiprocessors = 0;   // SMs (NVIDIA) or compute units (AMD)
  std::string architecture;  // "compute capability 9.0" or "gfx942:sramecc+:xnack-"
};
GpuDeviceInfo gpu_device_info(int index);
// Makes GPU `index` this process's device: every later allocation, kernel and NCCL
// communicator of this thread lives there. Called once, before the model is built.
void use_gpu(int index);

// ---- Peaks and placement (backend/device.cpp; --device is backend/device_selection.h) ----

// The environment variable that restricts the GPUs this build's runtime sees:
// "CUDA_VISIBLE_DEVICES" (or HIP_VISIBLE_DEVICES in a HIP build).
const char* gpu_visible_devices_variable();

// Dense bf16 tensor-core peak of a GPU, by the name its runtime reports, in TFLOP/s: the
// denominator of MFU on that GPU. 0 when the device is not in the table.
double gpu_peak_bf16_tflops(const std::string& device_name);

// This process's index among the ranks on its node, from the launcher's environment
// (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID, MPI_LOCALRANKID, LOCAL_RANK; torchrun's LOCAL_RANK
// first when torchrun's agent started the process, as under `srun torchrun`); 0 when started
// alone. One GPU per process: the local rank modulo the visible devices picks it.
int launcher_local_rank();
// How many ranks the launcher started on this node (OMPI_COMM_WORLD_LOCAL_SIZE,
// SLURM_NTASKS_PER_NODE, MPI_LOCALNRANKS, LOCAL_WORLD_SIZE, in the same order as above); 1 when
// none says. `source` (when given) gets the variable and its value ("LOCAL_WORLD_SIZE=2").
int launcher_local_size(std::string* source = nullptr);

}  // namespace omni
