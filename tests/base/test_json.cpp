// The one JSON reader (base/json.h) against Python's json.loads: what it refuses, what it
// decodes, and NaN/Infinity only where a caller opts in. Both ways in are checked: the tree
// (json::parse) and preprocessing's fields (json::parse_text_fields).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json.h"

namespace omni {
namespace {

// The error of parsing `text` as a document, or "" when it parses.
std::string tree_error(const std::string& text, json::Options options = {}) {
  try {
    json::parse(text, "t.json", options);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

// The "text" field of a JSON line, or "error: ..." when the line is refused.
std::string text_of(const std::string& line) {
  static const std::vector<std::string> keys{"text"};
  std::vector<json::TextField> fields;
  try {
    json::parse_text_fields(line, keys, fields);
  } catch (const UsageError& e) {
    return std::string("error: ") + e.what();
  }
  return fields[0].present && fields[0].texts.size() == 1 ? fields[0].texts[0] : "(not one text)";
}

bool refused(const std::string& text) {
  return !tree_error(text).empty();
}

TEST(JsonReader, LoneSurrogatesAreRefusedAsJsonLoadsDoes) {
  EXPECT_EQ(json::parse(R"("\ud83d\ude00")", "t").str(), "\xF0\x9F\x98\x80");
  EXPECT_NE(tree_error(R"("a\ud83d")").find("byte 2: lone high surrogate"), std::string::npos);
  EXPECT_NE(tree_error(R"("\ude00")").find("lone low surrogate"), std::string::npos);
  EXPECT_NE(tree_error(R"("\ud83dx")").find("lone high surrogate"), std::string::npos);
  EXPECT_NE(tree_error(R"("\ud83d\u0041")").find("non-low surrogate"), std::string::npos);
  EXPECT_NE(tree_error(R"("\ud83d\ud83d")").find("non-low surrogate"), std::string::npos);
  // In a field preprocessing skips, too: json.loads reads the whole line.
  EXPECT_NE(text_of(R"({"meta": ["\udc00"], "text": "a"})").find("lone low surrogate"),
            std::string::npos);
}

TEST(JsonReader, NanAndInfinityAreNumbersOnlyWhenAskedFor) {
  EXPECT_NE(tree_error("NaN").find("NaN is not JSON"), std::string::npos);
  EXPECT_NE(tree_error("[Infinity]").find("Infinity is not JSON"), std::string::npos);
  EXPECT_NE(tree_error("-Infinity").find("Infinity is not JSON"), std::string::npos);
  const json::Value v = json::parse("[NaN, Infinity, -Infinity]", "t", {.allow_nan = true});
  EXPECT_TRUE(std::isnan(v.arr()[0].num()));
  EXPECT_EQ(v.arr()[1].num(), INFINITY);
  EXPECT_EQ(v.arr()[2].num(), -INFINITY);
  EXPECT_TRUE(refused("nan") && refused("Inf") && refused("-NaN"));
  EXPECT_EQ(text_of(R"({"n": NaN, "m": [-Infinity, Infinity], "text": "a"})"), "a");
}

TEST(JsonReader, TheLastDuplicateKeyWins) {
  const json::Value v = json::parse(R"({"a": 1, "b": 2, "a": 3})", "t");
  EXPECT_EQ(v.find("a")->num(), 3);
  EXPECT_EQ(v.obj().size(), 3u);  // kept, for callers that refuse duplicates
  EXPECT_EQ(text_of(R"({"text": "a", "text": "bc"})"), "bc");
  EXPECT_EQ(text_of(R"({"text": 5, "text": "bc"})"), "bc");
  EXPECT_EQ(text_of(R"({"text": [1], "text": "bc"})"), "bc");
  EXPECT_NE(text_of(R"({"text": "bc", "text": 5})").find("column 24: field \"text\" is a number"),
            std::string::npos);
}

TEST(JsonReader, NestingDeeperThan512LevelsIsRefusedWithoutCrashing) {
  // The outermost value is at depth 0: 513 arrays deep is the most.
  EXPECT_EQ(tree_error(std::string(513, '[') + std::string(513, ']')), "");
  EXPECT_NE(tree_error(std::string(514, '[') + std::string(514, ']')).find("byte 513: JSON nested"),
            std::string::npos);
  EXPECT_TRUE(refused(std::string(1000000, '[')));
  EXPECT_TRUE(refused(std::string(500000, '{').insert(1, "\"a\":")));
  EXPECT_EQ(
      text_of("{\"m\": " + std::string(511, '[') + std::string(511, ']') + ", \"text\": \"a\"}"),
      "a");
}

TEST(JsonReader, InvalidUtf8IsRefusedValidUtf8Kept) {
  // U+0080, U+07FF, U+0800, U+D7FF, U+E000, U+FFFF, U+10000, U+10FFFF: the boundaries.
  const std::string valid =
      "\xC2\x80\xDF\xBF\xE0\xA0\x80\xED\x9F\xBF\xEE\x80\x80\xEF\xBF\xBF\xF0\x90\x80\x80\xF4\x8F\xBF"
      "\xBF";
  EXPECT_EQ(json::parse("\"" + valid + "\"", "t").str(), valid);
  EXPECT_EQ(text_of("{\"text\": \"" + valid + "\"}"), valid);
  for (const char* bad : {"\x80", "\xBF", "\xC0\xAF", "\xC1\xBF", "\xE0\x9F\xBF", "\xED\xA0\x80",
                          "\xED\xBF\xBF", "\xF0\x8F\xBF\xBF", "\xF4\x90\x80\x80",
                          "\xF5\x80\x80\x80", "\xFF", "\xE4\xB8", "\xE4\xB8x", "\xF0\x9F\x98"}) {
    const std::string error = tree_error("\"ab" + std::string(bad) + "\"");
    EXPECT_NE(error.find("byte 3: invalid UTF-8"), std::string::npos) << error;
    EXPECT_NE(
        text_of("{\"m\": \"" + std::string(bad) + "\", \"text\": \"a\"}").find("invalid UTF-8"),
        std::string::npos);
  }
  EXPECT_TRUE(refused("\xC3\xA9"));  // outside a string, non-ASCII is no JSON token
}

// The string scanner reads 8 bytes at a time: a quote, backslash, control or non-ASCII byte
// at every position of a word must still be found.
TEST(JsonReader, EveryByteOfALongStringIsChecked) {
  for (size_t n = 0; n < 40; ++n) {
    const std::string s(n, 'a');
    for (size_t at = 0; at <= n; ++at) {
      // s with `middle` inserted at `at`, in quotes when `quote`.
      auto with = [&](std::string_view middle, bool quote) {
        std::string t = quote ? "\"" : "";
        t.append(s, 0, at);
        t.append(middle);
        t.append(s, at);
        if (quote) t.push_back('"');
        return t;
      };
      EXPECT_EQ(json::parse(with("\\\"", true), "t").str(), with("\"", false));
      EXPECT_EQ(json::parse(with("\xC3\xA9", true), "t").str(), with("\xC3\xA9", false));
      EXPECT_EQ(json::parse(with("\x7F~!", true), "t").str(), with("\x7F~!", false));
      EXPECT_TRUE(refused(with("\x1F", true)));
      EXPECT_TRUE(refused(with("\xFF", true)));
      EXPECT_TRUE(refused(with("\x85", true)));  // 0x80-0x9F: no high bit after "minus 0x20"
      EXPECT_EQ(json::parse(with("\xC2\x85", true), "t").str(), with("\xC2\x85", false));
      EXPECT_TRUE(refused(with("\x7F\xC3", true)));
    }
  }
}

TEST(JsonReader, TheGrammarIsStrict) {
  for (const char* bad :
       {"01",     "-01",      "1.",        ".5",        "+1",          "1e",
        "1e+",    "-",        "0x10",      "[1,]",      "{\"a\": 1,}", "{'a': 1}",
        "{a: 1}", "\"a\tb\"", "\"\\x41\"", "\"\\u12\"", "[1 2]",       "{\"a\" 1}",
        "tru",    "nulll",    "1 2",       "",          "  ",          "\"abc"})
    EXPECT_TRUE(refused(bad)) << bad;
  EXPECT_EQ(json::parse(" -0.5e2 ", "t").num(), -50);
  EXPECT_EQ(json::parse("1E+2", "t").num(), 100);
  EXPECT_EQ(json::parse("1e400", "t").num(), INFINITY);  // float('1e400') in Python
  EXPECT_EQ(json::parse("-1e400", "t").num(), -INFINITY);
  EXPECT_EQ(json::parse("1e-400", "t").num(), 0);
  EXPECT_EQ(json::parse("9007199254740993", "t").num(), 9007199254740992.0);
  const json::Value v =
      json::parse(R"( {"a": [true, false, null, "\/\b\f\n\r\t\u00e9"], "b": {}} )", "t");
  EXPECT_TRUE(v.find("a")->arr()[0].boolean());
  EXPECT_TRUE(v.find("a")->arr()[2].is_null());
  EXPECT_EQ(v.find("a")->arr()[3].str(), "/\b\f\n\r\t\xC3\xA9");
  EXPECT_TRUE(v.find("b")->is_object());
  EXPECT_EQ(tree_error("[1, 2"),
            "t.json: malformed JSON at byte 5: expected ']', found the end of the input");
  EXPECT_EQ(tree_error("{} x"),
            "t.json: malformed JSON at byte 3: extra data after the JSON value");
}

}  // namespace
}  // namespace omni
