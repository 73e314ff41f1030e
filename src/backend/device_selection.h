// --device auto|cpu|cuda|hip: which device a command runs on, decided from what this build has
// and what its GPU runtime sees (backend/device.cpp).
#pragma once

#include <string>

#include "tensor/tensor.h"

namespace omni {

// The GPU backend this build has (CPU when none) and what it sees in this process.
struct GpuAvailability {
  DeviceKind backend = DeviceKind::CPU;
  int devices = 0;
  std::string probe_error;      // gpu_probe_error() when no device is seen
  std::string visible_devices;  // the value of CUDA_/HIP_VISIBLE_DEVICES, or "unset"
};
GpuAvailability gpu_availability();

struct ResolvedDevice {
  Device device;         // a GPU's index is launcher_local_rank() modulo the visible GPUs
  int gpus_visible = 0;  // GPUs the backend sees, whatever was chosen
};

// cpu is the CPU; cuda/hip are that GPU backend, or a UsageError saying what to check when the
// build lacks it or it sees no device; auto is the GPU when the build has a backend that sees
// a device, else the CPU. `here` describes the machine (tests pass their own).
ResolvedDevice resolve_device(const std::string& requested, const GpuAvailability& here);
ResolvedDevice resolve_device(const std::string& requested);  // on this machine

}  // namespace omni
