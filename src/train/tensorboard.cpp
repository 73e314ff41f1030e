#include "train/tensorboard.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <type_traits>

#include "base/crc32c.h"
#include "base/error.h"

namespace omni {

namespace {

// Protocol buffer wire format: a key is (field number << 3 | wire type).
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(uint8_t(v) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}

void put_key(std::string& out, uint32_t field, WireType type) {
  put_varint(out, field << 3 | type);
}

template <typename T>
void put_little_endian(std::string& out, T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  unsigned char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));  // x86-64 and AArch64 Linux are little endian
  out.append(reinterpret_cast<const char*>(bytes), sizeof(T));
}

void put_bytes(std::string& out, uint32_t field, std::string_view bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event { double wall_time = 1; int64 step = 2; } with what comes after appended by the caller.
std::string event_header(int64_t step) {
  const double wall_time =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string event;
  put_key(event, 1, kFixed64);
  put_little_endian(event, wall_time);
  put_key(event, 2, kVarint);
  put_varint(event, uint64_t(step));
  return event;
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

std::atomic<int> g_writers_opened{0};

}  // namespace

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  OMNI_REQUIRE(!ec, "--tensorboard-dir: cannot create '", dir, "': ", ec.message());
  const auto seconds = std::chrono::duration_cast<std::chrono::seconds>(
                           std::chrono::system_clock::now().time_since_epoch())
                           .count();
  char name[512];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.%d", (long long)seconds,
                host_name().c_str(), int(getpid()), g_writers_opened++);
  path_ = (std::filesystem::path(dir) / name).string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  OMNI_REQUIRE(out_, "--tensorboard-dir: cannot write '", path_, "'");
  std::string event = event_header(0);
  put_bytes(event, 3, "brain.Event:2");  // file_version
  write_record(event);
  flush();
}

void TensorBoardWriter::add_scalar(std::string_view tag, double value, int64_t step) {
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, kFixed32);
  put_little_endian(summary_value, float(value));
  std::string summary;
  put_bytes(summary, 1, summary_value);  // Summary.value (repeated; one here)
  std::string event = event_header(step);
  put_bytes(event, 5, summary);  // Event.summary
  write_record(event);
}

void TensorBoardWriter::write_record(std::string_view data) {
  std::string header;
  put_little_endian(header, uint64_t(data.size()));
  put_little_endian(header, mask_crc32c(crc32c(header)));
  std::string footer;
  put_little_endian(footer, mask_crc32c(crc32c(data)));
  out_ << header << data << footer;
}

void TensorBoardWriter::flush() {
  out_.flush();
  OMNI_REQUIRE(out_, "--tensorboard-dir: writing '", path_, "' failed");
}

}  // namespace omni
