// Streaming input of JSON lines files: the bytes of a file (zstd-decompressed when it is a
// .zst), split into lines (base/json.h reads a JSON line's fields). Shared by the two rooms that
// read JSON lines, so it sits above both: preprocessing (`omnitron preprocess`) and the
// datasets' multiple-choice task files.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

namespace omni {

// A file's bytes, decompressed on the fly when the file starts with zstd's magic number
// (concatenated frames included, as `zstd` writes for large inputs). Throws UsageError naming
// the file on an I/O or decompression error, and on a .zst that ends inside a frame.
class InputFile {
 public:
  explicit InputFile(const std::string& path);
  ~InputFile();
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;

  // Up to `capacity` bytes into `out`; 0 only at the end of the input.
  size_t read(char* out, size_t capacity);
  const std::string& path() const { return path_; }
  bool compressed() const { return zstd_ != nullptr; }
  int64_t file_bytes_read() const { return file_bytes_read_; }  // compressed bytes for .zst

 private:
  size_t read_file(char* out, size_t capacity);

  std::string path_;
  int fd_ = -1;
  int64_t file_bytes_read_ = 0;
  struct Zstd;
  std::unique_ptr<Zstd> zstd_;
};

// The lines of an InputFile, each without its '\n'. A last line without '\n' is a line; an
// empty file has none.
class LineReader {
 public:
  explicit LineReader(const std::string& path);

  // The next line, valid until the next call; false at the end of the input.
  bool next(std::string_view& line);
  int64_t line_number() const { return line_number_; }  // of the last line returned, from 1
  int64_t bytes_read() const { return bytes_read_; }    // decompressed, newlines included
  const InputFile& file() const { return file_; }

 private:
  InputFile file_;
  std::string buffer_;
  size_t begin_ = 0, end_ = 0;
  bool eof_ = false;
  int64_t line_number_ = 0;
  int64_t bytes_read_ = 0;
};

}  // namespace omni
