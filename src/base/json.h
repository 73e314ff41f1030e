// omnitron's one JSON reader, with Python json.loads's rules: strict RFC 8259 grammar (no
// leading zeros, trailing commas or raw control characters in strings), the text strict UTF-8,
// \uXXXX escapes decoded to UTF-8 with surrogate pairs joined and a lone surrogate refused,
// the last of duplicate keys wins, nesting deeper than 512 refused. NaN, Infinity and
// -Infinity (which json.loads accepts) are numbers only where a caller opts in: preprocessing,
// whose JSON lines come from Python. Two ways in: a whole document as a tree of Values
// (tokenizer files, safetensors headers, config.json, metrics files), and the text fields of a
// JSON line without building a tree (`omnitron preprocess`).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace omni::json {

struct Value;
using Array = std::vector<Value>;
// Members in file order, duplicates kept so that a caller can refuse them (safetensors).
using Object = std::vector<std::pair<std::string, Value>>;

struct Value {
  std::variant<std::nullptr_t, bool, double, std::string, Array, Object> v;

  bool is_null() const { return std::holds_alternative<std::nullptr_t>(v); }
  bool is_string() const { return std::holds_alternative<std::string>(v); }
  bool is_number() const { return std::holds_alternative<double>(v); }
  bool is_array() const { return std::holds_alternative<Array>(v); }
  bool is_object() const { return std::holds_alternative<Object>(v); }
  bool is_bool() const { return std::holds_alternative<bool>(v); }
  const std::string& str() const { return std::get<std::string>(v); }
  double num() const { return std::get<double>(v); }
  bool boolean() const { return std::get<bool>(v); }
  const Array& arr() const { return std::get<Array>(v); }
  const Object& obj() const { return std::get<Object>(v); }
  // The last member named key of an object (json.loads keeps the last), or nullptr (also
  // when this is not an object).
  const Value* find(std::string_view key) const;
};

struct Options {
  bool allow_nan = false;  // NaN, Infinity, -Infinity as numbers
};

// Throws UsageError "<source>: malformed JSON at byte N: ...".
Value parse(std::string_view text, const std::string& source, Options options = {});

// A top-level field of a JSON object as Megatron's preprocess_data.py reads it: a string (one
// sentence) or a list of strings (pre-split sentences).
struct TextField {
  bool present = false;
  std::vector<std::string> texts;
};

// Reads `line`, one JSON object with NaN/Infinity allowed, and fills fields[i] with its
// top-level field keys[i]; a missing field is left `present = false`. Throws UsageError
// "column C: ..." when the line is not JSON, not an object, or the (last) value of a requested
// field is neither a string nor a list of strings.
void parse_text_fields(std::string_view line, std::span<const std::string> keys,
                       std::vector<TextField>& fields);

}  // namespace omni::json
