// Streaming input for `omnitron preprocess`: the bytes of a file (zstd-decompressed when it is
// a .zst), split into lines, and the string fields of a JSON-lines record.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

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

// A top-level field of a JSON object as Megatron's preprocess_data.py reads it: a string (one
// sentence) or a list of strings (pre-split sentences).
struct JsonTextField {
  bool present = false;
  std::vector<std::string> texts;
};

// Parses `line` as Python's json.loads does (the whole line must be one JSON value: strict
// strings without raw control characters, NaN/Infinity accepted, the last duplicate key wins)
// and fills fields[i] with the top-level field keys[i]. Every escape is decoded, \uXXXX
// surrogate pairs to one UTF-8 character; a lone surrogate is an error (Megatron's tokenizers
// cannot encode one either). Raw bytes are passed through, not checked as UTF-8. Throws
// UsageError "column C: ..." when the line is not JSON, not an object, or a requested field
// is neither a string nor a list of strings; a missing field is left `present = false`.
void parse_json_fields(std::string_view line, std::span<const std::string> keys,
                       std::vector<JsonTextField>& fields);

}  // namespace omni
