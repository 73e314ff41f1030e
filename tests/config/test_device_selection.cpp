// --device auto|cpu|cuda|hip against described machines (GpuAvailability), the launcher's local
// rank, and the table of GPU peaks MFU is measured against.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "backend/device.h"
#include "backend/device_selection.h"
#include "base/error.h"

namespace omni {
namespace {

GpuAvailability machine(DeviceKind backend, int devices, std::string visible = "unset",
                        std::string probe_error = "") {
  GpuAvailability a;
  a.backend = backend;
  a.devices = devices;
  a.visible_devices = std::move(visible);
  a.probe_error = std::move(probe_error);
  return a;
}

// The UsageError's message, or "" when resolving succeeds.
std::string error_of(const std::string& requested, const GpuAvailability& here) {
  try {
    resolve_device(requested, here);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(DeviceSelection, CpuIsTheCpuWhateverTheMachineHas) {
  EXPECT_EQ(resolve_device("cpu", machine(DeviceKind::CUDA, 8)).device.kind, DeviceKind::CPU);
  EXPECT_EQ(resolve_device("cpu", machine(DeviceKind::CPU, 0)).device.kind, DeviceKind::CPU);
}

TEST(DeviceSelection, AutoPicksTheGpuWhenTheBuildHasOneThatSeesADevice) {
  const ResolvedDevice cuda = resolve_device("auto", machine(DeviceKind::CUDA, 2));
  EXPECT_EQ(cuda.device.kind, DeviceKind::CUDA);
  EXPECT_EQ(cuda.gpus_visible, 2);
  EXPECT_EQ(resolve_device("auto", machine(DeviceKind::HIP, 1)).device.kind, DeviceKind::HIP);
}

TEST(DeviceSelection, AutoFallsBackToTheCpuWithoutABackendOrADevice) {
  EXPECT_EQ(resolve_device("auto", machine(DeviceKind::CUDA, 0)).device.kind, DeviceKind::CPU);
  EXPECT_EQ(resolve_device("auto", machine(DeviceKind::CPU, 0)).device.kind, DeviceKind::CPU);
}

TEST(DeviceSelection, AutoIsTheCpuOnThisMachineWhenNoGpuIsVisible) {
  if (gpu_device_count() > 0) GTEST_SKIP() << "a GPU is visible here";
  EXPECT_EQ(resolve_device("auto").device.kind, DeviceKind::CPU);
}

TEST(DeviceSelection, NamedGpuPicksTheLocalRanksDevice) {
  const ResolvedDevice d = resolve_device("cuda", machine(DeviceKind::CUDA, 4));
  EXPECT_EQ(d.device.kind, DeviceKind::CUDA);
  EXPECT_EQ(d.device.index, launcher_local_rank() % 4);
}

TEST(DeviceSelection, CudaInABuildWithoutItSaysHowToRebuild) {
  const std::string e = error_of("cuda", machine(DeviceKind::CPU, 0));
  EXPECT_NE(e.find("--device cuda: this omnitron was built without CUDA"), std::string::npos) << e;
  EXPECT_NE(e.find("-DOMNITRON_CUDA=ON"), std::string::npos) << e;
}

TEST(DeviceSelection, HipInACudaBuildSaysWhichBackendTheBuildHas) {
  const std::string e = error_of("hip", machine(DeviceKind::CUDA, 1));
  EXPECT_NE(e.find("built without HIP (it has CUDA)"), std::string::npos) << e;
  EXPECT_NE(e.find("-DOMNITRON_HIP=ON"), std::string::npos) << e;
}

TEST(DeviceSelection, CudaWithoutAVisibleDeviceSaysWhatToCheck) {
  const std::string e =
      error_of("cuda", machine(DeviceKind::CUDA, 0, "-1", "no CUDA-capable device is detected"));
  for (const char* part :
       {"--device cuda: no CUDA GPU is visible", "(no CUDA-capable device is detected)",
        "nvidia-smi", "driver", "CUDA_VISIBLE_DEVICES (now '-1')", "--device cpu"})
    EXPECT_NE(e.find(part), std::string::npos) << part << " in: " << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;  // the CLI prints it as one line
}

TEST(DeviceSelection, HipWithoutAVisibleDeviceNamesRocmsTools) {
  const std::string e = error_of("hip", machine(DeviceKind::HIP, 0));
  for (const char* part : {"no HIP GPU is visible", "rocm-smi", "HIP_VISIBLE_DEVICES (unset)"})
    EXPECT_NE(e.find(part), std::string::npos) << part << " in: " << e;
}

// torchrun --nproc-per-node 2 (or mpirun -np 2) on a node where one GPU is visible.
GpuAvailability two_ranks_one_gpu() {
  GpuAvailability a = machine(DeviceKind::CUDA, 1, "0");
  a.local_ranks = 2;
  a.local_ranks_source = "LOCAL_WORLD_SIZE=2";
  return a;
}

TEST(DeviceSelection, NamedGpuWithMoreRanksOnTheNodeThanGpusNamesBothNumbers) {
  const std::string e = error_of("cuda", two_ranks_one_gpu());
  for (const char* part :
       {"--device cuda: 2 ranks run on this node (LOCAL_WORLD_SIZE=2) and 1 CUDA GPU is visible "
        "(CUDA_VISIBLE_DEVICES=0)",
        "torchrun --nproc-per-node 1", "make 2 GPUs visible"})
    EXPECT_NE(e.find(part), std::string::npos) << part << " in: " << e;
  EXPECT_EQ(e.find('\n'), std::string::npos) << e;
}

TEST(DeviceSelection, AutoWithMoreRanksOnTheNodeThanGpusTrainsOnTheCpuAndSaysWhy) {
  const ResolvedDevice d = resolve_device("auto", two_ranks_one_gpu());
  EXPECT_EQ(d.device.kind, DeviceKind::CPU);
  EXPECT_NE(d.note.find("2 ranks run on this node"), std::string::npos) << d.note;
  GpuAvailability enough = two_ranks_one_gpu();
  enough.devices = 2;
  EXPECT_EQ(resolve_device("auto", enough).device.kind, DeviceKind::CUDA);
}

TEST(DeviceSelection, UnknownDeviceIsRejected) {
  EXPECT_NE(error_of("tpu", machine(DeviceKind::CPU, 0)).find("not one of auto, cpu, cuda, hip"),
            std::string::npos);
}

// Restores an environment variable when the test ends.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_, old_.c_str(), 1);
    else
      unsetenv(name_);
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(LauncherLocalRank, ReadsTorchrunsVariable) {
  ScopedEnv local("LOCAL_RANK", "3");
  EXPECT_EQ(launcher_local_rank(), 3);
}

TEST(LauncherLocalRank, MpirunsVariableComesFirst) {
  ScopedEnv local("LOCAL_RANK", "3");
  ScopedEnv ompi("OMPI_COMM_WORLD_LOCAL_RANK", "1");
  EXPECT_EQ(launcher_local_rank(), 1);
}

TEST(LauncherLocalRank, TorchrunsAgentComesFirstUnderSrun) {
  ScopedEnv slurm("SLURM_LOCALID", "0");  // `srun torchrun`: one srun task per node
  ScopedEnv local("LOCAL_RANK", "3");
  ScopedEnv agent("TORCHELASTIC_RUN_ID", "job");
  EXPECT_EQ(launcher_local_rank(), 3);
}

TEST(LauncherLocalSize, ReadsTheLaunchersRanksPerNodeAndNamesTheVariable) {
  ScopedEnv local("LOCAL_WORLD_SIZE", "4");
  std::string source;
  EXPECT_EQ(launcher_local_size(&source), 4);
  EXPECT_EQ(source, "LOCAL_WORLD_SIZE=4");
}

// Dense bf16 peaks from the vendors' data sheets, looked up by the names the runtimes report.
TEST(GpuPeak, KnownDevicesByTheirRuntimeNames) {
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA H100 80GB HBM3"), 989);  // SXM
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA H100 PCIe"), 756);
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA H100 NVL"), 835);
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA H200"), 989);
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA A100-SXM4-80GB"), 312);
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA A100 80GB PCIe"), 312);
  EXPECT_EQ(gpu_peak_bf16_tflops("AMD Instinct MI300X"), 1307);
  EXPECT_EQ(gpu_peak_bf16_tflops("AMD Instinct MI250X / MI250"), 383);
  EXPECT_EQ(gpu_peak_bf16_tflops("AMD Instinct MI210"), 181);
}

TEST(GpuPeak, UnknownDevicesHaveNoPeak) {
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA GeForce RTX 4090"), 0);
  EXPECT_EQ(gpu_peak_bf16_tflops("NVIDIA A10"), 0);
  EXPECT_EQ(gpu_peak_bf16_tflops(""), 0);
}

}  // namespace
}  // namespace omni
