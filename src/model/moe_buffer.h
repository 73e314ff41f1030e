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
    if (!memory_) {
      if (n > host_.capacity()) host_.reserve(n);  // exactly n, as on a device
      return host_.resize(n);
    }
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
  // Elements allocated: the largest size held so far.
  size_t capacity() const { return memory_ ? capacity_ : host_.capacity(); }
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

// The temporaries of MoE layers' backwards (and of the gated shared expert's forward): one
// set for all the MoE layers of a model (MoELayer::share_scratch), which run one at a time.
// Each buffer grows to the largest layer's need and stays: no step allocates device memory
// for them again, and the host's peak is one layer's temporaries, as when each backward
// allocated and freed its own. Router: the routing's type (float for 16-bit storage).
template <typename T, typename Router>
struct MoEScratch {
  explicit MoEScratch(const ops::Exec& e) {
    for (MoEBuffer<T>* b : {&rows_out, &row_weight, &act, &fc1, &rows_in, &probs, &rows, &exchange})
      b->set_exec(e);
    for (MoEBuffer<Router>* b : {&logits, &probs_wide, &x_wide}) b->set_exec(e);
  }
  // The experts' rows' gradients: rows_out (their output's; the shared expert's gated
  // output's), act and fc1 (the activation's input and output; the shared expert's after
  // the routed experts'), rows_in (their input's); row_weight the combine weights'.
  MoEBuffer<T> rows_out, row_weight, act, fc1, rows_in, probs;
  // Expert parallelism's rows: `rows` in this rank's plan order (or gathered over the ranks),
  // `exchange` the all-to-all's staging (forward and backward).
  MoEBuffer<T> rows, exchange;
  // The routing's gradients in its type: the logits', the probabilities' (16-bit storage),
  // the router's input's before its rounding.
  MoEBuffer<Router> logits, probs_wide, x_wide;

  // Bytes allocated (each buffer at the largest size it has held).
  int64_t bytes() const {
    int64_t b = 0;
    for (const MoEBuffer<T>* v :
         {&rows_out, &row_weight, &act, &fc1, &rows_in, &probs, &rows, &exchange})
      b += int64_t(v->capacity() * sizeof(T));
    for (const MoEBuffer<Router>* v : {&logits, &probs_wide, &x_wide})
      b += int64_t(v->capacity() * sizeof(Router));
    return b;
  }
};

}  // namespace omni
