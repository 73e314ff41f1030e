#include "base/json.h"

#include <bit>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "base/error.h"

namespace omni::json {

const Value* Value::find(std::string_view key) const {
  if (!is_object()) return nullptr;
  const Value* found = nullptr;
  for (const auto& [k, val] : obj())
    if (k == key) found = &val;
  return found;
}

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

// 0x80 in each byte of the 8 little-endian bytes `w` that ends a run of plain string bytes:
// '"', '\\', a control character or a non-ASCII byte. Exact up to the first such byte (the
// subtractions' borrows can only mark bytes after it).
uint64_t run_enders(uint64_t w) {
  constexpr uint64_t k01 = 0x0101010101010101, k80 = 0x8080808080808080;
  const uint64_t quote = w ^ (k01 * '"'), backslash = w ^ (k01 * '\\');
  return ((w - k01 * 0x20) | ((quote - k01) & ~quote) | ((backslash - k01) & ~backslash) | w) & k80;
}

// Parses one JSON text. With `source` set, errors read "<source>: malformed JSON at byte N";
// without, "column C" (a JSON line, whose caller names the file and line).
class Reader {
 public:
  Reader(std::string_view text, const std::string* source, Options options)
      : begin_(text.data()),
        p_(text.data()),
        end_(text.data() + text.size()),
        source_(source),
        options_(options) {}

  Value document() {
    Value v;
    skip_space();
    value(0, &v);
    skip_space();
    if (p_ != end_) fail("extra data after the JSON value");
    return v;
  }

  void text_fields(std::span<const std::string> keys, std::vector<TextField>& fields) {
    fields.resize(keys.size());
    for (TextField& f : fields) {
      f.present = false;
      f.texts.clear();
    }
    not_text_.assign(keys.size(), {});
    skip_space();
    if (p_ == end_) fail("empty line, expected a JSON object");
    if (*p_ != '{') {
      value(0, nullptr);  // a malformed value reports its own error first
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
        string(&key_);
        skip_space();
        expect(':');
        skip_space();
        size_t first = keys.size();
        for (size_t i = 0; i < keys.size(); ++i) {
          if (keys[i] != key_) continue;
          if (first == keys.size()) {
            first = i;
            text_field(fields[i], not_text_[i]);
          } else {
            fields[i] = fields[first];
            not_text_[i] = not_text_[first];
          }
        }
        if (first == keys.size()) value(1, nullptr);
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
    for (const auto& [at, what] : not_text_)
      if (at) fail_at(at, what);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { fail_at(p_, what); }
  [[noreturn]] void fail_at(const char* at, const std::string& what) const {
    if (source_)
      throw UsageError(
          detail::concat(*source_, ": malformed JSON at byte ", at - begin_, ": ", what));
    throw UsageError(detail::concat("column ", at - begin_ + 1, ": ", what));
  }
  const char* the_end() const { return source_ ? "the end of the input" : "the end of the line"; }
  char peek() const { return p_ < end_ ? *p_ : '\0'; }
  void expect(char c) {
    if (peek() != c)
      fail(p_ == end_ ? detail::concat("expected '", c, "', found ", the_end())
                      : detail::concat("expected '", c, "', found '", *p_, "'"));
    ++p_;
  }
  void skip_space() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  // A value at p_ (after white space) into *out, or checked and skipped when out is null.
  void value(int depth, Value* out) {
    if (depth > kMaxDepth) fail("JSON nested deeper than 512 levels");
    switch (peek()) {
      case '"':
        ++p_;
        if (!out) return string(nullptr);
        out->v = std::string();
        return string(&std::get<std::string>(out->v));
      case '{':
        return object(depth, out);
      case '[':
        return array(depth, out);
      case 't':
        literal("true");
        if (out) out->v = true;
        return;
      case 'f':
        literal("false");
        if (out) out->v = false;
        return;
      case 'n':
        literal("null");
        if (out) out->v = nullptr;
        return;
      case 'N':
        return non_finite("NaN", std::numeric_limits<double>::quiet_NaN(), out);
      case 'I':
        return non_finite("Infinity", std::numeric_limits<double>::infinity(), out);
      default:
        return number(out);
    }
  }

  void object(int depth, Value* out) {
    ++p_;
    Object members;
    skip_space();
    if (peek() != '}') {
      for (;;) {
        skip_space();
        if (peek() != '"') fail("expected a field name in double quotes");
        ++p_;
        if (out) members.emplace_back();
        string(out ? &members.back().first : nullptr);
        skip_space();
        expect(':');
        skip_space();
        value(depth + 1, out ? &members.back().second : nullptr);
        skip_space();
        if (peek() != ',') break;
        ++p_;
      }
    }
    expect('}');
    if (out) out->v = std::move(members);
  }

  void array(int depth, Value* out) {
    ++p_;
    Array items;
    skip_space();
    if (peek() != ']') {
      for (;;) {
        skip_space();
        if (out) items.emplace_back();
        value(depth + 1, out ? &items.back() : nullptr);
        skip_space();
        if (peek() != ',') break;
        ++p_;
      }
    }
    expect(']');
    if (out) out->v = std::move(items);
  }

  void literal(std::string_view word) {
    if (size_t(end_ - p_) < word.size() || std::string_view(p_, word.size()) != word)
      fail("invalid JSON value");
    p_ += word.size();
  }

  void non_finite(std::string_view word, double v, Value* out) {
    if (!options_.allow_nan)
      fail(std::string(word) + " is not JSON (only preprocessing input may hold NaN/Infinity)");
    literal(word);
    if (out) out->v = v;
  }

  static bool digit(char c) { return c >= '0' && c <= '9'; }

  void number(Value* out) {
    const char* start = p_;
    if (peek() == '-') {
      ++p_;
      if (peek() == 'I')
        return non_finite("Infinity", -std::numeric_limits<double>::infinity(), out);
    }
    if (peek() == '0') {
      ++p_;
    } else if (digit(peek())) {
      while (digit(peek())) ++p_;
    } else {
      fail_at(start, p_ == end_
                         ? detail::concat("expected a JSON value, found ", the_end())
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
    if (!out) return;
    double d = 0;
    if (std::from_chars(start, p_, d).ec != std::errc())  // out of range: ±inf or 0, as Python
      d = std::strtod(std::string(start, p_).c_str(), nullptr);
    out->v = d;
  }

  uint32_t hex4() {
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

  // The length of the UTF-8 sequence at p_, whose first byte c is not ASCII; fails on
  // an invalid one (a stray or overlong byte, an encoded surrogate, past U+10FFFF, truncated).
  size_t utf8_length(unsigned char c) const {
    unsigned lo = 0x80, hi = 0xBF;
    size_t n = 4;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 3;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      n = 0;
    }
    bool ok = n != 0 && size_t(end_ - p_) >= n;
    for (size_t i = 1; ok && i < n; ++i) {
      const auto b = static_cast<unsigned char>(p_[i]);
      ok = i == 1 ? b >= lo && b <= hi : (b & 0xC0) == 0x80;
    }
    if (!ok) {
      char hex[8];
      std::snprintf(hex, sizeof(hex), "0x%02X", c);
      fail(detail::concat("invalid UTF-8 in a string (a sequence starting with byte ", hex, ")"));
    }
    return n;
  }

  // Moves p_ past the bytes a string holds as they are: ASCII other than '"', '\\' and
  // control characters, and valid UTF-8 sequences.
  void plain_run() {
    while (p_ < end_) {
      if (end_ - p_ >= 8) {
        uint64_t w;
        std::memcpy(&w, p_, 8);
        if constexpr (std::endian::native == std::endian::big) w = __builtin_bswap64(w);
        const uint64_t enders = run_enders(w);
        if (enders == 0) {
          p_ += 8;
          continue;
        }
        p_ += std::countr_zero(enders) / 8;
      }
      const auto c = static_cast<unsigned char>(*p_);
      if (c >= 0x80)
        p_ += utf8_length(c);
      else if (c == '"' || c == '\\' || c < 0x20)
        return;
      else
        ++p_;
    }
  }

  // After the opening quote; decodes into *out unless out is null (a value we skip).
  void string(std::string* out) {
    if (out) out->clear();
    for (;;) {
      const char* run = p_;
      plain_run();
      if (out) out->append(run, p_);
      if (p_ == end_) fail("unterminated string");
      if (*p_ == '"') {
        ++p_;
        return;
      }
      if (*p_ != '\\') fail("raw control character in a string (it must be escaped)");
      const char* escape = p_++;
      if (p_ == end_) fail("unterminated string");
      const char e = *p_++;
      char decoded;
      switch (e) {
        case '"':
        case '\\':
        case '/':
          decoded = e;
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
          uint32_t cp = hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (end_ - p_ < 6 || p_[0] != '\\' || p_[1] != 'u')
              fail_at(escape, "lone high surrogate in a \\u escape (no \\uDC00-\\uDFFF after it)");
            p_ += 2;
            const uint32_t low = hex4();
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

  // A requested field: a string or a list of strings into `field`. Another value is an error
  // only if no later duplicate of the key replaces it (json.loads keeps the last), so it is
  // recorded in `not_text` and thrown once the line is read.
  void text_field(TextField& field, std::pair<const char*, std::string>& not_text) {
    const char* at = p_;
    field.present = true;
    field.texts.clear();
    not_text = {};
    if (peek() == '"') {
      ++p_;
      field.texts.emplace_back();
      return string(&field.texts.back());
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
        if (peek() == '"') {
          ++p_;
          field.texts.emplace_back();
          string(&field.texts.back());
        } else {
          if (!not_text.first)
            not_text = {p_, "field \"" + key_ + "\" is a list holding a non-string value"};
          value(2, nullptr);
        }
        skip_space();
        if (peek() != ',') break;
        ++p_;
      }
      return expect(']');
    }
    const char c = peek();
    value(1, nullptr);
    const char* kind = c == '{'               ? "an object"
                       : c == 't' || c == 'f' ? "a boolean"
                       : c == 'n'             ? "null"
                                              : "a number";
    not_text = {at,
                "field \"" + key_ + "\" is " + kind + ", expected a string or a list of strings"};
  }

  const char* begin_;
  const char* p_;
  const char* end_;
  const std::string* source_;
  Options options_;
  std::string key_;
  std::vector<std::pair<const char*, std::string>> not_text_;
};

}  // namespace

Value parse(std::string_view text, const std::string& source, Options options) {
  return Reader(text, &source, options).document();
}

void parse_text_fields(std::string_view line, std::span<const std::string> keys,
                       std::vector<TextField>& fields) {
  Reader(line, nullptr, Options{.allow_nan = true}).text_fields(keys, fields);
}

}  // namespace omni::json
