// A small JSON reader for tokenizer files (tokenizer.json, vocab.json): the whole document
// parsed into a tree of Values. Strings are UTF-8, \uXXXX escapes (surrogate pairs
// included) are decoded.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace omni::json {

struct Value;
using Array = std::vector<Value>;
// Members in file order (vocab.json order does not matter, but duplicates are kept visible).
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
  // The member named key of an object, or nullptr (also when this is not an object).
  const Value* find(std::string_view key) const;
};

// Throws UsageError naming `source` (a file name) and the byte offset of the problem.
Value parse(std::string_view text, const std::string& source);

}  // namespace omni::json
