#include "data/jsonl.h"

#include <fcntl.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>

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

// ---------------------------------------------------------------------------------------------
// JSON

namespace {

constexpr int kMaxDepth = 512;  // deeper nesting is refused rather than overflowing the stack

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

class JsonParser {
 public:
  explicit JsonParser(std::string_view text)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()) {}

  void parse_line(std::span<const std::string> keys, std::vector<JsonTextField>& fields) {
    fields.resize(keys.size());
    for (JsonTextField& f : fields) {
      f.present = false;
      f.texts.clear();
    }
    skip_space();
    if (p_ == end_) fail("empty line, expected a JSON object");
    if (*p_ != '{') {
      parse_value(0);  // a malformed value reports its own error first
      fail_at(begin_, "expected a JSON object, found another JSON value");
    }
    ++p_;
    skip_space();
    if (peek() == '}') {
      ++p_;
    } else {
      for (;;) {
        skip_space();
        if (peek() != '"') fail("expected a field name in double quotes");
        ++p_;
        parse_string(&key_);
        skip_space();
        expect(':');
        skip_space();
        int wanted = -1;
        for (size_t i = 0; i < keys.size(); ++i)
          if (keys[i] == key_) wanted = static_cast<int>(i);
        if (wanted >= 0)
          parse_text_field(fields[static_cast<size_t>(wanted)]);
        else
          parse_value(1);
        skip_space();
        if (peek() == ',') {
          ++p_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skip_space();
    if (p_ != end_) fail("extra data after the JSON object");
  }

 private:
  [[noreturn]] void fail(const std::string& what) { fail_at(p_, what); }
  [[noreturn]] void fail_at(const char* at, const std::string& what) {
    throw UsageError(detail::concat("column ", at - begin_ + 1, ": ", what));
  }
  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  void expect(char c) {
    if (peek() != c)
      fail(p_ == end_ ? detail::concat("expected '", c, "', found the end of the line")
                      : detail::concat("expected '", c, "', found '", *p_, "'"));
    ++p_;
  }
  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  void parse_text_field(JsonTextField& field) {
    const char* at = p_;
    const std::string name = key_;
    field.present = true;
    field.texts.clear();
    if (peek() == '"') {
      ++p_;
      field.texts.emplace_back();
      parse_string(&field.texts.back());
      return;
    }
    if (peek() == '[') {
      ++p_;
      skip_space();
      if (peek() == ']') {
        ++p_;
        return;
      }
      for (;;) {
        skip_space();
        if (peek() != '"') {
          const char* element = p_;
          parse_value(2);
          fail_at(element, "field \"" + name + "\" is a list holding a non-string value");
        }
        ++p_;
        field.texts.emplace_back();
        parse_string(&field.texts.back());
        skip_space();
        if (peek() == ',') {
          ++p_;
          continue;
        }
        expect(']');
        return;
      }
    }
    const char c = peek();
    parse_value(1);
    const char* kind = c == '{'               ? "an object"
                       : c == 't' || c == 'f' ? "a boolean"
                       : c == 'n'             ? "null"
                                              : "a number";
    fail_at(at, "field \"" + name + "\" is " + kind + ", expected a string or a list of strings");
  }

  void parse_value(int depth) {
    if (depth > kMaxDepth) fail("JSON nested deeper than 512 levels");
    switch (peek()) {
      case '"':
        ++p_;
        parse_string(nullptr);
        return;
      case '{':
        ++p_;
        skip_space();
        if (peek() == '}') {
          ++p_;
          return;
        }
        for (;;) {
          skip_space();
          if (peek() != '"') fail("expected a field name in double quotes");
          ++p_;
          parse_string(nullptr);
          skip_space();
          expect(':');
          skip_space();
          parse_value(depth + 1);
          skip_space();
          if (peek() == ',') {
            ++p_;
            continue;
          }
          expect('}');
          return;
        }
      case '[':
        ++p_;
        skip_space();
        if (peek() == ']') {
          ++p_;
          return;
        }
        for (;;) {
          skip_space();
          parse_value(depth + 1);
          skip_space();
          if (peek() == ',') {
            ++p_;
            continue;
          }
          expect(']');
          return;
        }
      case 't':
        return parse_literal("true");
      case 'f':
        return parse_literal("false");
      case 'n':
        return parse_literal("null");
      case 'N':
        return parse_literal("NaN");
      case 'I':
        return parse_literal("Infinity");
      default:
        return parse_number();
    }
  }

  void parse_literal(std::string_view word) {
    if (static_cast<size_t>(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word)
      fail("invalid JSON value");
    p_ += word.size();
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  void parse_number() {
    const char* start = p_;
    if (peek() == '-') {
      ++p_;
      if (peek() == 'I') return parse_literal("Infinity");
    }
    if (peek() == '0') {
      ++p_;
    } else if (digit(peek())) {
      while (digit(peek())) ++p_;
    } else {
      fail_at(start, p_ == end_
                         ? std::string("expected a JSON value, found the end of the line")
                         : "invalid JSON value starting with '" + std::string(1, *start) + "'");
    }
    if (peek() == '.') {
      ++p_;
      if (!digit(peek())) fail("expected a digit after the decimal point");
      while (digit(peek())) ++p_;
    }
    if (peek() == 'e' || peek() == 'E') {
      ++p_;
      if (peek() == '+' || peek() == '-') ++p_;
      if (!digit(peek())) fail("expected a digit in the exponent");
      while (digit(peek())) ++p_;
    }
  }

  uint32_t parse_hex4() {
    if (end_ - p_ < 4) fail("truncated \\u escape");
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = p_[i];
      uint32_t d;
      if (c >= '0' && c <= '9')
        d = static_cast<uint32_t>(c - '0');
      else if (c >= 'a' && c <= 'f')
        d = static_cast<uint32_t>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F')
        d = static_cast<uint32_t>(c - 'A' + 10);
      else
        fail("invalid \\u escape: expected 4 hex digits");
      value = value * 16 + d;
    }
    p_ += 4;
    return value;
  }

  // After the opening quote; decodes into *out unless out is null (a value we skip).
  void parse_string(std::string* out) {
    if (out) out->clear();
    for (;;) {
      const char* run = p_;
      while (p_ < end_ && *p_ != '"' && *p_ != '\\' && static_cast<unsigned char>(*p_) >= 0x20)
        ++p_;
      if (out) out->append(run, p_);
      if (p_ == end_) fail("unterminated string");
      const char c = *p_;
      if (c == '"') {
        ++p_;
        return;
      }
      if (c != '\\') fail("raw control character in a string (it must be escaped)");
      const char* escape = p_;
      ++p_;
      if (p_ == end_) fail("unterminated string");
      const char e = *p_++;
      char decoded;
      switch (e) {
        case '"':
          decoded = '"';
          break;
        case '\\':
          decoded = '\\';
          break;
        case '/':
          decoded = '/';
          break;
        case 'b':
          decoded = '\b';
          break;
        case 'f':
          decoded = '\f';
          break;
        case 'n':
          decoded = '\n';
          break;
        case 'r':
          decoded = '\r';
          break;
        case 't':
          decoded = '\t';
          break;
        case 'u': {
          uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u')
              fail_at(escape, "lone high surrogate in a \\u escape (no \\uDC00-\\uDFFF after it)");
            p_ += 2;
            const uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF)
              fail_at(escape, "high surrogate in a \\u escape followed by a non-low surrogate");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail_at(escape, "lone low surrogate in a \\u escape");
          }
          if (out) append_utf8(*out, cp);
          continue;
        }
        default:
          fail_at(escape, "invalid escape \\" + std::string(1, e));
      }
      if (out) out->push_back(decoded);
    }
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  std::string key_;
};

}  // namespace

void parse_json_fields(std::string_view line, std::span<const std::string> keys,
                       std::vector<JsonTextField>& fields) {
  JsonParser(line).parse_line(keys, fields);
}

}  // namespace omni
