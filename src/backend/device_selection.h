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
  std::string probe_error;         // gpu_probe_error() when no device is seen
  std::string visible_devices;     // the value of CUDA_/HIP_VISIBLE_DEVICES, or "unset"
  int local_ranks = 1;             // ranks the launcher started on this node
  std::string local_ranks_source;  // the variable that says so ("LOCAL_WORLD_SIZE=2")
};
GpuAvailability gpu_availability();

struct ResolvedDevice {
  Device device;         // a GPU's index is launcher_local_rank() modulo the visible GPUs
  int gpus_visible = 0;  // GPUs the backend sees, whatever was chosen
  std::string note;      // why auto chose the CPU though a GPU is visible
};

// cpu is the CPU; cuda/hip are that GPU backend, or a UsageError saying what to check when the
// build lacks it or it sees no device, or when more ranks run on this node than it sees GPUs
// (one GPU per rank; the message names both numbers); auto is the GPU when the build has a
// backend that sees a device for every rank of the node, else the CPU (with a note when GPUs
// are visible). `here` describes the machine (tests pass their own).
ResolvedDevice resolve_device(const std::string& requested, const GpuAvailability& here);
ResolvedDevice resolve_device(const std::string& requested);  // on this machine

// Why no GPU can be used here, in one clause for messages ("no CUDA GPU is visible (...):
// check ..."); empty when the build's backend sees a device.
std::string why_no_gpu(const GpuAvailability& here);

}  // namespace omni
