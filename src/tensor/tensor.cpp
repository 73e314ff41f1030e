#include "tensor/tensor.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>

namespace omni {

std::string Device::str() const {
  switch (kind) {
    case DeviceKind::CPU:
      return "cpu";
    case DeviceKind::CUDA:
      return "cuda:" + std::to_string(index);
    case DeviceKind::HIP:
      return "hip:" + std::to_string(index);
  }
  return "?";
}

Storage::Storage(size_t bytes, Device device, const DeviceMemory* memory)
    : bytes_(bytes), device_(device), memory_(memory) {
  OMNI_CHECK((device.kind == DeviceKind::CPU) == (memory == nullptr), "[storage] ", device.str(),
             memory ? " memory from a device allocator" : " memory needs the device's allocator");
  if (memory_) {
    data_ = memory_->allocate(bytes ? bytes : 1);
    return;
  }
  size_t rounded = (bytes + 63) / 64 * 64;
  data_ = std::aligned_alloc(64, rounded ? rounded : 64);
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, rounded);
}

Storage::~Storage() {
  if (memory_)
    memory_->deallocate(data_);
  else
    std::free(data_);
}

std::string shape_str(const Shape& shape) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << "]";
  return os.str();
}

static int64_t product(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

static Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t s = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Tensor Tensor::zeros(Shape shape, DType dtype, Device device, const DeviceMemory* memory) {
  for (int64_t d : shape) OMNI_CHECK(d >= 0, "[tensor] negative dimension in ", shape_str(shape));
  Tensor t;
  t.storage_ = std::make_shared<Storage>(product(shape) * dtype_size(dtype), device, memory);
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  t.dtype_ = dtype;
  return t;
}

int64_t Tensor::numel() const {
  return product(shape_);
}

void* Tensor::raw() const {
  OMNI_CHECK(storage_, "[tensor] data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + offset_ * dtype_size(dtype_);
}

Tensor Tensor::view(int64_t offset, Shape shape) const {
  OMNI_CHECK(storage_, "[tensor] view of an undefined tensor");
  int64_t n = product(shape);
  OMNI_CHECK(offset >= 0 && (offset_ + offset + n) * dtype_size(dtype_) <= storage_->bytes(),
             "[tensor] view ", shape_str(shape), " at offset ", offset,
             " exceeds storage of a tensor shaped ", shape_str(shape_));
  Tensor t = *this;
  t.offset_ = offset_ + offset;
  t.strides_ = contiguous_strides(shape);
  t.shape_ = std::move(shape);
  return t;
}

void Tensor::zero_() {
  if (const DeviceMemory* m = memory())
    m->zero(raw(), bytes());
  else
    std::memset(raw(), 0, bytes());
}

}  // namespace omni
