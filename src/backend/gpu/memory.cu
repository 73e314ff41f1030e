// Devices, memory and scratch space of the GPU backend (gpu_ops.h).
#include <memory>
#include <mutex>
#include <vector>

#include "backend/gpu/gpu_ops.h"
#include "backend/gpu/gpu_runtime.h"

OMNI_GPU_NAMESPACE_BEGIN

int device_count() {
  int n = 0;
  if (gpuGetDeviceCount(&n) != gpuSuccess) {
    (void)gpuGetLastError();  // no driver or no device: clear the sticky error, report none
    return 0;
  }
  return n;
}

void set_device(int index) {
  OMNI_GPU_CHECK(gpuSetDevice(index));
}

void synchronize() {
  OMNI_GPU_CHECK(gpuDeviceSynchronize());
}

void synchronize(Stream stream) {
  OMNI_GPU_CHECK(gpuStreamSynchronize(static_cast<gpuStream_t>(stream)));
}

void* device_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  if (gpuMalloc(&p, bytes) != gpuSuccess) {
    (void)gpuGetLastError();
    size_t free_bytes = 0, total_bytes = 0;
    (void)gpuMemGetInfo(&free_bytes, &total_bytes);
    throw UsageError("out of GPU memory: cannot allocate " + std::to_string(bytes >> 20) +
                     " MiB (" + std::to_string(free_bytes >> 20) + " MiB free of " +
                     std::to_string(total_bytes >> 20) +
                     " MiB); try a smaller --micro-batch-size, activation recompute "
                     "(--recompute-activations) or more tensor/pipeline parallelism");
  }
  return p;
}

void device_free(void* p) {
  if (p) (void)gpuFree(p);  // never throws: called from destructors
}

void copy_to_device(void* dst, const void* host_src, size_t bytes) {
  if (bytes) OMNI_GPU_CHECK(gpuMemcpy(dst, host_src, bytes, gpuMemcpyHostToDevice));
}

void copy_to_host(void* host_dst, const void* src, size_t bytes) {
  if (bytes) OMNI_GPU_CHECK(gpuMemcpy(host_dst, src, bytes, gpuMemcpyDeviceToHost));
}

void copy_on_device(void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes)
    OMNI_GPU_CHECK(
        gpuMemcpyAsync(dst, src, bytes, gpuMemcpyDeviceToDevice, static_cast<gpuStream_t>(stream)));
}

void copy_rows_on_device(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                         size_t width, size_t rows, Stream stream) {
  if (width && rows)
    OMNI_GPU_CHECK(gpuMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, rows,
                                    gpuMemcpyDeviceToDevice, static_cast<gpuStream_t>(stream)));
}

void fill_zero(void* p, size_t bytes, Stream stream) {
  if (bytes) OMNI_GPU_CHECK(gpuMemsetAsync(p, 0, bytes, static_cast<gpuStream_t>(stream)));
}

void* scratch(size_t bytes, int slot) {
  // One set of slots per device; a grown slot frees its old buffer after the device is idle,
  // since ops enqueued earlier may still read it.
  struct Slot {
    void* p = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mutex;
  // Never destroyed: the buffers live as long as the process, reachable (LeakSanitizer).
  static auto& slots = *new std::vector<std::vector<Slot>>;
  const std::lock_guard lock(mutex);
  int device = 0;
  OMNI_GPU_CHECK(gpuGetDevice(&device));
  if (slots.size() <= static_cast<size_t>(device)) slots.resize(device + 1);
  auto& mine = slots[device];
  if (mine.size() <= static_cast<size_t>(slot)) mine.resize(slot + 1);
  Slot& s = mine[slot];
  if (s.bytes < bytes) {
    if (s.p) {
      OMNI_GPU_CHECK(gpuDeviceSynchronize());
      device_free(s.p);
    }
    s.bytes = std::max(bytes, s.bytes * 2);
    s.p = device_alloc(s.bytes);
  }
  return s.p;
}

OMNI_GPU_NAMESPACE_END
