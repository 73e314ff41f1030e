// TensorBoard event files, written as TensorBoard (and PyTorch's SummaryWriter, which
// Megatron uses) writes them: a TFRecord file of serialized Event protos. Each record is
//   uint64 length | uint32 masked CRC-32C of the length bytes | data | uint32 masked CRC of data
// (little endian; see base/crc32c.h for the mask). The first Event carries file_version
// "brain.Event:2"; each scalar is one Event { wall_time = 1, step = 2, summary = 5 } whose
// Summary holds one Value { tag = 1, simple_value = 2 } (tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto).
#pragma once

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace omni {

class TensorBoardWriter {
 public:
  // Creates `dir` if needed and starts a new file in it named as PyTorch's SummaryWriter
  // names them: events.out.tfevents.<unix seconds>.<host>.<pid>.<n>, n counting the writers
  // this process opened (so two writers never share a file).
  explicit TensorBoardWriter(const std::string& dir);
  // One scalar at `step`, stamped with the current wall time. TensorBoard stores it as a
  // 32-bit float, as every writer does.
  void add_scalar(std::string_view tag, double value, int64_t step);
  // Pushes what was written to the file (TensorBoard reads a file while it grows).
  void flush();
  const std::string& path() const { return path_; }

 private:
  void write_record(std::string_view data);
  std::string path_;
  std::ofstream out_;
};

}  // namespace omni
