// A buffered stdio file that closes itself; open, write and close errors are UsageErrors
// naming the file.
#pragma once

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "base/error.h"

namespace omni {

class BufferedFile {
 public:
  BufferedFile(std::string path, const char* mode) : path_(std::move(path)) {
    f_ = std::fopen(path_.c_str(), mode);
    OMNI_REQUIRE(f_ != nullptr, "cannot open ", path_, ": ", std::strerror(errno));
    std::setvbuf(f_, nullptr, _IOFBF, 1 << 20);
  }
  ~BufferedFile() {
    if (f_) std::fclose(f_);
  }
  BufferedFile(const BufferedFile&) = delete;
  BufferedFile& operator=(const BufferedFile&) = delete;

  void write(const void* data, size_t n) {
    OMNI_REQUIRE(n == 0 || std::fwrite(data, 1, n, f_) == n, "write to ", path_,
                 " failed: ", std::strerror(errno));
  }
  template <typename T>
  void put(T value) {
    write(&value, sizeof(T));
  }
  size_t read(void* data, size_t n) { return std::fread(data, 1, n, f_); }
  void close() {
    const bool ok = std::fclose(f_) == 0;
    f_ = nullptr;
    OMNI_REQUIRE(ok, "closing ", path_, " failed: ", std::strerror(errno));
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  FILE* f_ = nullptr;
};

}  // namespace omni
