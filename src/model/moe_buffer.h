// MoEBuffer: a resizable array of T in an Exec's memory (host memory for the CPU, the GPU's
// otherwise), the MoE layer's activations and routing (model/moe_layer.h) on every device.
// resize() keeps no contents when it grows (every user writes the array after resizing it);
// host() is the contents in host memory, a copy made on each call on a GPU.
#pragma once

#include <algorithm>
#include <cstddef>
#include <memory>
#include <vector>

#include "backend/ops.h"

namespace omni {

template <typename T>
class MoEBuffer {
 public:
  MoEBuffer() = default;
  explicit MoEBuffer(const ops::Exec& e, size_t n = 0) : memory_(e.memory()) { resize(n); }
  void set_exec(const ops::Exec& e) {
    if (memory_ != e.memory()) *this = MoEBuffer(e, size_);
  }

  void resize(size_t n) {
    size_ = n;
    if (!memory_) return host_.resize(n);
    if (n <= capacity_) return;
    const DeviceMemory* m = memory_;
    device_ = std::shared_ptr<T>(static_cast<T*>(m->allocate(n * sizeof(T))),
                                 [m](T* p) { m->deallocate(p); });
    capacity_ = n;
  }
  // n zeros.
  void assign_zeros(size_t n) {
    resize(n);
    if (memory_)
      memory_->zero(data(), n * sizeof(T));
    else
      std::fill(host_.begin(), host_.end(), T(0));
  }
  void clear() { resize(0); }

  T* data() { return memory_ ? device_.get() : host_.data(); }
  const T* data() const { return memory_ ? device_.get() : host_.data(); }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  const std::vector<T>& host() const {
    if (memory_) {
      host_.resize(size_);
      if (size_) memory_->download(host_.data(), device_.get(), size_ * sizeof(T));
    }
    return host_;
  }

 private:
  const DeviceMemory* memory_ = nullptr;  // null: host memory (host_)
  size_t size_ = 0, capacity_ = 0;
  mutable std::vector<T> host_;
  std::shared_ptr<T> device_;
};

}  // namespace omni
