// Tensor: shape, strides, dtype and device over shared storage. No autograd: layers
// own their forward and backward explicitly (DESIGN.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "base/device_memory.h"
#include "base/dtype.h"
#include "base/error.h"

namespace omni {

enum class DeviceKind : uint8_t { CPU, CUDA, HIP };

struct Device {
  DeviceKind kind = DeviceKind::CPU;
  int index = 0;
  std::string str() const;
  bool operator==(const Device&) const = default;
};

// Zero-filled memory: on the host (no `memory`), 64-byte aligned so vector loads never
// straddle lines; on a device, from that device's memory.
class Storage {
 public:
  Storage(size_t bytes, Device device, const DeviceMemory* memory = nullptr);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }
  Device device() const { return device_; }
  const DeviceMemory* memory() const { return memory_; }

 private:
  void* data_ = nullptr;
  size_t bytes_ = 0;
  Device device_;
  const DeviceMemory* memory_ = nullptr;
};

using Shape = std::vector<int64_t>;
std::string shape_str(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;
  // Host memory, or `memory`'s (a device's) when given.
  static Tensor zeros(Shape shape, DType dtype, Device device = {},
                      const DeviceMemory* memory = nullptr);

  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int64_t dim(int i) const { return shape_.at(i < 0 ? shape_.size() + i : i); }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const;
  DType dtype() const { return dtype_; }
  Device device() const { return storage_ ? storage_->device() : Device{}; }
  // The device memory the data lives in; null: host memory.
  const DeviceMemory* memory() const { return storage_ ? storage_->memory() : nullptr; }
  bool defined() const { return storage_ != nullptr; }
  size_t bytes() const { return numel() * dtype_size(dtype_); }
  // The bytes it holds: 0 for a tensor never allocated (whose empty shape is a scalar's).
  int64_t held_bytes() const { return defined() ? int64_t(bytes()) : 0; }

  template <typename T>
  T* data() const {
    OMNI_CHECK(dtype_of<T>() == dtype_, "[tensor] asked for ", dtype_name(dtype_of<T>()),
               " data of a ", dtype_name(dtype_), " tensor");
    return reinterpret_cast<T*>(raw());
  }
  void* raw() const;

  // A contiguous view of numel(shape) elements starting `offset` elements in.
  Tensor view(int64_t offset, Shape shape) const;
  Tensor reshape(Shape shape) const { return view(0, std::move(shape)); }
  void zero_();

 private:
  std::shared_ptr<Storage> storage_;
  int64_t offset_ = 0;  // in elements
  Shape shape_, strides_;
  DType dtype_ = DType::F32;
};

}  // namespace omni
