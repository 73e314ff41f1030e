// Which device --device names on this machine, and the peaks MFU is measured against. Plain
// C++ in every build: the GPU queries it uses live in backend/gpu/device.cu (or no_gpu.cpp).
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <initializer_list>
#include <string>

#include "backend/device.h"
#include "backend/device_selection.h"
#include "base/error.h"

namespace omni {

namespace {

#if defined(OMNITRON_CUDA)
constexpr DeviceKind kBuiltBackend = DeviceKind::CUDA;
#elif defined(OMNITRON_HIP)
constexpr DeviceKind kBuiltBackend = DeviceKind::HIP;
#else
constexpr DeviceKind kBuiltBackend = DeviceKind::CPU;
#endif

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

// Where a user looks when a GPU backend sees no device.
std::string what_to_check(DeviceKind backend, const GpuAvailability& here) {
  const bool cuda = backend == DeviceKind::CUDA;
  return std::string("check that ") + (cuda ? "nvidia-smi" : "rocm-smi") +
         " lists a GPU (the driver is installed and loaded" +
         (cuda ? "" : ", and this user may open /dev/kfd and /dev/dri") + ") and that " +
         (cuda ? "CUDA_VISIBLE_DEVICES" : "HIP_VISIBLE_DEVICES") + " (" +
         (here.visible_devices == "unset" ? "unset" : "now '" + here.visible_devices + "'") +
         ") does not hide it";
}

std::string gpus_visible(DeviceKind backend, int n) {
  return std::to_string(n) + (backend == DeviceKind::HIP ? " HIP" : " CUDA") + " GPU" +
         (n == 1 ? " is" : "s are") + " visible";
}

}  // namespace

const char* gpu_visible_devices_variable() {
  return kBuiltBackend == DeviceKind::HIP ? "HIP_VISIBLE_DEVICES" : "CUDA_VISIBLE_DEVICES";
}

GpuAvailability gpu_availability() {
  GpuAvailability a;
  a.backend = kBuiltBackend;
  if (a.backend == DeviceKind::CPU) return a;
  a.local_ranks = launcher_local_size(&a.local_ranks_source);
  a.devices = gpu_device_count();
  if (a.devices == 0) a.probe_error = gpu_probe_error();
  const char* v = std::getenv(gpu_visible_devices_variable());
  a.visible_devices = v ? v : "unset";
  return a;
}

ResolvedDevice resolve_device(const std::string& requested, const GpuAvailability& here) {
  ResolvedDevice r;
  r.gpus_visible = here.devices;
  DeviceKind want = DeviceKind::CPU;
  if (requested == "auto") {
    if (here.backend == DeviceKind::CPU || here.devices == 0) return r;
    want = here.backend;
  } else if (requested != "cpu") {
    OMNI_REQUIRE(requested == "cuda" || requested == "hip", "--device: '", requested,
                 "' is not one of auto, cpu, cuda, hip");
    want = requested == "cuda" ? DeviceKind::CUDA : DeviceKind::HIP;
    const bool cuda = want == DeviceKind::CUDA;
    OMNI_REQUIRE(here.backend == want, "--device ", requested, ": this omnitron was built without ",
                 cuda ? "CUDA" : "HIP",
                 here.backend == DeviceKind::CPU ? ""
                 : cuda                          ? " (it has HIP)"
                                                 : " (it has CUDA)",
                 ": rebuild with ",
                 cuda ? "-DOMNITRON_CUDA=ON (nvcc on the PATH or in /usr/local/cuda/bin)"
                      : "-DOMNITRON_HIP=ON (ROCm's hipcc)",
                 ", or use --device cpu");
    OMNI_REQUIRE(here.devices > 0, "--device ", requested, ": no ", cuda ? "CUDA" : "HIP",
                 " GPU is visible (",
                 here.probe_error.empty() ? "the runtime found no device" : here.probe_error,
                 "): ", what_to_check(want, here), "; or use --device cpu");
  }
  if (want == DeviceKind::CPU) return r;
  // One GPU per rank: more ranks on this node than GPUs would share one (NCCL refuses that).
  if (here.local_ranks > here.devices) {
    const std::string ranks =
        std::to_string(here.local_ranks) + " ranks run on this node (" + here.local_ranks_source +
        ") and " + gpus_visible(want, here.devices) + " (" + gpu_visible_devices_variable() +
        (here.visible_devices == "unset" ? " unset" : "=" + here.visible_devices) + ")";
    if (requested == "auto") {
      r.note = "--device auto: " + ranks + ", so the CPU trains (one GPU per rank)";
      return r;
    }
    throw UsageError("--device " + requested + ": " + ranks + "; each rank needs its own GPU: " +
                     "start at most " + std::to_string(here.devices) +
                     " per node (torchrun --nproc-per-node " + std::to_string(here.devices) +
                     ", mpirun -npernode " + std::to_string(here.devices) + ") or make " +
                     std::to_string(here.local_ranks) + " GPUs visible");
  }
  r.device = Device{want, launcher_local_rank() % here.devices};
  return r;
}

std::string why_no_gpu(const GpuAvailability& here) {
  if (here.backend == DeviceKind::CPU)
    return "this omnitron was built without CUDA or HIP (rebuild with -DOMNITRON_CUDA=ON or "
           "-DOMNITRON_HIP=ON)";
  if (here.devices > 0) return "";
  return std::string("no ") + (here.backend == DeviceKind::HIP ? "HIP" : "CUDA") +
         " GPU is visible (" +
         (here.probe_error.empty() ? "the runtime found no device" : here.probe_error) +
         "): " + what_to_check(here.backend, here);
}

ResolvedDevice resolve_device(const std::string& requested) {
  return resolve_device(requested, gpu_availability());
}

double gpu_peak_bf16_tflops(const std::string& device_name) {
  // Dense (not 2:4 sparse) bf16 tensor-core peaks from the vendors' data sheets. More specific
  // names come first: "H100 PCIe" and "H100 NVL" before "H100", "MI250X" before any MI250.
  struct Peak {
    const char* name;
    double tflops;
  };
  static const Peak kPeaks[] = {
      {"h100 pcie", 756}, {"h100 nvl", 835}, {"h100", 989},   {"h200 nvl", 835}, {"h200", 989},
      {"a100", 312},      {"mi300x", 1307},  {"mi250x", 383}, {"mi210", 181},
  };
  const std::string n = lower(device_name);
  for (const Peak& p : kPeaks)
    if (n.find(p.name) != std::string::npos) return p.tflops;
  return 0.0;
}

namespace {

// The first of the launchers' variables that is set, torchrun's first when its agent started
// this process (it is then the innermost launcher); nullptr when none is.
const char* first_launcher_variable(std::initializer_list<const char*> mpi_and_slurm,
                                    const char* torchrun, const char** name) {
  const char* agent = std::getenv("TORCHELASTIC_RUN_ID");
  if (const char* v = std::getenv(torchrun); agent && *agent && v && *v) return *name = torchrun, v;
  for (const char* var : mpi_and_slurm)
    if (const char* v = std::getenv(var); v && *v) return *name = var, v;
  if (const char* v = std::getenv(torchrun); v && *v) return *name = torchrun, v;
  return nullptr;
}

}  // namespace

int launcher_local_rank() {
  const char* name = nullptr;
  const char* v = first_launcher_variable(
      {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"}, "LOCAL_RANK", &name);
  return v ? std::max(0, std::atoi(v)) : 0;
}

int launcher_local_size(std::string* source) {
  const char* name = nullptr;
  const char* v = first_launcher_variable(
      {"OMPI_COMM_WORLD_LOCAL_SIZE", "SLURM_NTASKS_PER_NODE", "MPI_LOCALNRANKS"},
      "LOCAL_WORLD_SIZE", &name);
  if (!v || std::atoi(v) < 1) return 1;
  if (source) *source = std::string(name) + "=" + v;
  return std::atoi(v);
}

}  // namespace omni
