// Memory of a device other than the CPU, as the code above the backend sees it: storage for
// tensors and parameter buffers, and the copies that move data to and from it. Implemented by
// the GPU backend (backend/gpu_backend.h); plain C++17, so GPU sources include it too.
#pragma once

#include <cstddef>

namespace omni {

class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // Zero-filled; throws naming the size when the device is out of memory.
  virtual void* allocate(size_t bytes) const = 0;
  virtual void deallocate(void* p) const = 0;
  virtual void zero(void* p, size_t bytes) const = 0;
  // Host to device, device to host, device to device. Host copies return when the data is
  // there; device copies are ordered with the device's ops.
  virtual void upload(void* device_dst, const void* host_src, size_t bytes) const = 0;
  virtual void download(void* host_dst, const void* device_src, size_t bytes) const = 0;
  virtual void copy(void* dst, const void* src, size_t bytes) const = 0;
  // `rows` runs of `width` bytes from src to dst, src_pitch and dst_pitch bytes apart, ordered
  // like copy() (a device's strided copy: one call instead of one per row).
  virtual void copy_rows(void* dst, size_t dst_pitch, const void* src, size_t src_pitch,
                         size_t width, size_t rows) const {
    for (size_t r = 0; r < rows; ++r)
      copy(static_cast<char*>(dst) + r * dst_pitch, static_cast<const char*>(src) + r * src_pitch,
           width);
  }
  // Waits until every op enqueued so far has finished.
  virtual void synchronize() const = 0;
};

}  // namespace omni
