// Safetensors, the weight format of Hugging Face models: an 8-byte little-endian header
// length N, N bytes of JSON
//   {"__metadata__": {"k": "v", ...},
//    "name": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...}
// (possibly padded with spaces), then the data area; offsets count from its start, every
// tensor is row-major little-endian, and the tensors tile the data area exactly (no gaps,
// no overlaps), as the format's specification requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "base/dtype.h"
#include "tensor/tensor.h"

namespace omni {

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  const unsigned char* data = nullptr;  // into the mapping; may be unaligned
  size_t bytes = 0;
  int64_t numel() const;
};

// A safetensors file mapped read-only. The constructor validates the whole header; every
// problem is a UsageError naming the file and, where there is one, the tensor. Dtypes read:
// F32, F16, BF16 and F64.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&&) = delete;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // In data order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  // The tensor called `name`, or null.
  const SafetensorsTensor* find(const std::string& name) const;
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Converts a stored tensor's numel() values to float32.
void read_as_f32(const SafetensorsTensor& t, float* dst);
// Converts `count` values from element `first` on (a part of the tensor; in range).
void read_as_f32(const SafetensorsTensor& t, int64_t first, int64_t count, float* dst);

// One tensor to write: its values come from `fill`, called once with numel() float32s to
// set, just before they are written (so a writer never holds more than one tensor).
struct SafetensorsOutput {
  std::string name;
  Shape shape;
  std::function<void(float*)> fill;
};

// Writes the tensors in order, stored as `dtype` (F32, BF16 or F16), to `path` through a
// temporary file renamed into place. The header is padded with spaces so the data area
// starts 8-byte aligned, as Hugging Face writes it.
void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       DType dtype, const std::map<std::string, std::string>& metadata = {});

}  // namespace omni
