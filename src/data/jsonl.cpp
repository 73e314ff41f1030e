#include "data/jsonl.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "base/error.h"

namespace omni {

// ---------------------------------------------------------------------------------------------
// InputFile

struct InputFile::Zstd {
  ZSTD_DStream* stream = ZSTD_createDStream();
  std::vector<char> in = std::vector<char>(ZSTD_DStreamInSize());
  ZSTD_inBuffer input{nullptr, 0, 0};
  size_t last_result = 0;  // 0 when the last frame ended cleanly
  bool file_done = false;
  ~Zstd() { ZSTD_freeDStream(stream); }
};

InputFile::InputFile(const std::string& path) : path_(path) {
  fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  OMNI_REQUIRE(fd_ >= 0, "cannot open ", path, ": ", std::strerror(errno));
  ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
  // zstd's frame magic number, little-endian 0xFD2FB528.
  unsigned char magic[4] = {};
  const ssize_t n = ::pread(fd_, magic, sizeof(magic), 0);
  if (n == 4 && magic[0] == 0x28 && magic[1] == 0xB5 && magic[2] == 0x2F && magic[3] == 0xFD) {
    zstd_ = std::make_unique<Zstd>();
    OMNI_CHECK(zstd_->stream != nullptr, "ZSTD_createDStream failed");
    ZSTD_initDStream(zstd_->stream);
  }
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

size_t InputFile::read_file(char* out, size_t capacity) {
  for (;;) {
    const ssize_t n = ::read(fd_, out, capacity);
    if (n >= 0) {
      file_bytes_read_ += n;
      return static_cast<size_t>(n);
    }
    if (errno != EINTR)
      throw UsageError(detail::concat("cannot read ", path_, ": ", std::strerror(errno)));
  }
}

size_t InputFile::read(char* out, size_t capacity) {
  if (!zstd_) return read_file(out, capacity);
  Zstd& z = *zstd_;
  ZSTD_outBuffer output{out, capacity, 0};
  while (output.pos == 0) {
    if (z.input.pos == z.input.size) {
      if (z.file_done) break;
      const size_t n = read_file(z.in.data(), z.in.size());
      if (n == 0) {
        z.file_done = true;
        break;
      }
      z.input = {z.in.data(), n, 0};
    }
    z.last_result = ZSTD_decompressStream(z.stream, &output, &z.input);
    OMNI_REQUIRE(!ZSTD_isError(z.last_result), path_, ": zstd: ", ZSTD_getErrorName(z.last_result));
  }
  if (output.pos == 0)
    OMNI_REQUIRE(z.last_result == 0, path_,
                 ": truncated zstd stream (the last frame is incomplete)");
  return output.pos;
}

// ---------------------------------------------------------------------------------------------
// LineReader

LineReader::LineReader(const std::string& path) : file_(path), buffer_(1 << 20, '\0') {}

bool LineReader::next(std::string_view& line) {
  for (;;) {
    const char* begin = buffer_.data() + begin_;
    if (const void* nl = std::memchr(begin, '\n', end_ - begin_)) {
      const size_t length = static_cast<size_t>(static_cast<const char*>(nl) - begin);
      line = std::string_view(begin, length);
      begin_ += length + 1;
      bytes_read_ += static_cast<int64_t>(length) + 1;
      ++line_number_;
      return true;
    }
    if (eof_) {
      if (begin_ == end_) return false;
      line = std::string_view(begin, end_ - begin_);
      bytes_read_ += static_cast<int64_t>(end_ - begin_);
      begin_ = end_;
      ++line_number_;
      return true;
    }
    // No complete line buffered: keep the partial line, grow for a line longer than the buffer.
    if (begin_ > 0) {
      std::memmove(buffer_.data(), begin, end_ - begin_);
      end_ -= begin_;
      begin_ = 0;
    }
    if (end_ == buffer_.size()) buffer_.resize(buffer_.size() * 2);
    const size_t n = file_.read(buffer_.data() + end_, buffer_.size() - end_);
    if (n == 0) eof_ = true;
    end_ += n;
  }
}

}  // namespace omni
