// Readers of TensorBoard event files for the tests, sharing no code with the writer
// (src/train/tensorboard.cpp, src/base/crc32c.cpp):
//  - read_event_file: a bit-at-a-time CRC-32C (no table) and a hand-rolled protobuf decoder
//    written from TFRecord's and event.proto's published layouts;
//  - run_node_reader: tests/tools/read_tfevents.js, which checks the CRCs with SheetJS's
//    CRC-32C and decodes with protobuf.js (both from scripts/fetch_test_tools.sh).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "cli/process.h"


namespace event_file {

inline uint32_t bitwise_crc32c(std::string_view bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int bit = 0; bit < 8; ++bit) crc = (crc & 1u) ? (crc >> 1) ^ 0x82F63B78u : crc >> 1;
  }
  return ~crc;
}

inline uint32_t masked_crc(std::string_view bytes) {
  const uint32_t crc = bitwise_crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

struct Event {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;                            // set on the first event only
  std::vector<std::pair<std::string, float>> scalars;  // Summary values (tag, simple_value)
};

// Protocol buffer wire format, read field by field.
class ProtoReader {
 public:
  explicit ProtoReader(std::string_view bytes) : bytes_(bytes) {}
  bool done() const { return pos_ >= bytes_.size(); }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0;; shift += 7) {
      if (pos_ >= bytes_.size() || shift > 63) throw std::runtime_error("bad varint");
      const auto b = uint8_t(bytes_[pos_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
  }
  std::string_view take(size_t n) {
    if (pos_ + n > bytes_.size()) throw std::runtime_error("field runs past the message");
    const std::string_view s = bytes_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  // Reads a key; returns (field number, wire type).
  std::pair<uint32_t, uint32_t> key() {
    const uint64_t k = varint();
    return {uint32_t(k >> 3), uint32_t(k & 7)};
  }
  void skip(uint32_t wire_type) {
    if (wire_type == 0)
      varint();
    else if (wire_type == 1)
      take(8);
    else if (wire_type == 2)
      take(varint());
    else if (wire_type == 5)
      take(4);
    else
      throw std::runtime_error("unknown wire type " + std::to_string(wire_type));
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

template <typename T>
T little_endian(std::string_view bytes) {
  T v;
  std::memcpy(&v, bytes.data(), sizeof(T));
  return v;
}

inline std::pair<std::string, float> decode_summary_value(std::string_view bytes) {
  ProtoReader r(bytes);
  std::pair<std::string, float> value{"", 0.0f};
  while (!r.done()) {
    const auto [field, type] = r.key();
    if (field == 1 && type == 2)
      value.first = std::string(r.take(r.varint()));
    else if (field == 2 && type == 5)
      value.second = little_endian<float>(r.take(4));
    else
      r.skip(type);
  }
  return value;
}

inline Event decode_event(std::string_view bytes) {
  ProtoReader r(bytes);
  Event e;
  while (!r.done()) {
    const auto [field, type] = r.key();
    if (field == 1 && type == 1) {
      e.wall_time = little_endian<double>(r.take(8));
    } else if (field == 2 && type == 0) {
      e.step = int64_t(r.varint());
    } else if (field == 3 && type == 2) {
      e.file_version = std::string(r.take(r.varint()));
    } else if (field == 5 && type == 2) {
      ProtoReader summary(r.take(r.varint()));
      while (!summary.done()) {
        const auto [f, t] = summary.key();
        if (f == 1 && t == 2)
          e.scalars.push_back(decode_summary_value(summary.take(summary.varint())));
        else
          summary.skip(t);
      }
    } else {
      r.skip(type);
    }
  }
  return e;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// All events of a file; throws std::runtime_error naming the record on a bad CRC or a
// truncated record.
inline std::vector<Event> read_event_file(const std::string& path) {
  const std::string file = read_bytes(path);
  const std::string_view f(file);
  std::vector<Event> events;
  for (size_t pos = 0, record = 0; pos < f.size(); ++record) {
    const std::string where = "record " + std::to_string(record) + ": ";
    if (pos + 12 > f.size()) throw std::runtime_error(where + "truncated header");
    if (masked_crc(f.substr(pos, 8)) != little_endian<uint32_t>(f.substr(pos + 8, 4)))
      throw std::runtime_error(where + "length CRC mismatch");
    const auto length = little_endian<uint64_t>(f.substr(pos, 8));
    if (pos + 12 + length + 4 > f.size()) throw std::runtime_error(where + "truncated data");
    const std::string_view data = f.substr(pos + 12, length);
    if (masked_crc(data) != little_endian<uint32_t>(f.substr(pos + 12 + length, 4)))
      throw std::runtime_error(where + "data CRC mismatch");
    events.push_back(decode_event(data));
    pos += 12 + length + 4;
  }
  return events;
}

// The scalars of one tag, as (step, value), in file order.
inline std::vector<std::pair<int64_t, float>> series(const std::vector<Event>& events,
                                                     const std::string& tag) {
  std::vector<std::pair<int64_t, float>> out;
  for (const Event& e : events)
    for (const auto& [t, v] : e.scalars)
      if (t == tag) out.emplace_back(e.step, v);
  return out;
}

inline std::filesystem::path repo_root() {
  return std::filesystem::path(OMNITRON_FIXTURE_DIR).parent_path().parent_path();
}

// tests/tools/read_tfevents.js on `path`. Fails the test (not skips) when the tools were not
// fetched.
inline ProcessResult run_node_reader(const std::string& path) {
  const auto tools = repo_root() / "data" / "test-tools";
  if (!std::filesystem::exists(tools / "protobuf.min.js"))
    ADD_FAILURE() << tools << " is missing: run scripts/setup.sh (scripts/fetch_test_tools.sh)";
  return run_command("node " + (repo_root() / "tests" / "tools" / "read_tfevents.js").string() +
                     " " + tools.string() + " '" + path + "'");
}

}  // namespace event_file
