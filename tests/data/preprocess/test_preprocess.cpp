// `omnitron preprocess` / merge-datasets as a library, against the bytes Megatron's
// preprocess_data.py and merge_datasets.py write for the same token ids.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/json.h"
#include "data/datasets/indexed_dataset.h"
#include "data/preprocess/preprocess.h"
#include "data/tokenizers/tokenizer.h"

namespace omni {
namespace {

// Bytes as ids 0..255, eod 256 (a stand-in for a real tokenizer: the pipeline only sees ids).
class BytesTokenizer : public Tokenizer {
 public:
  explicit BytesTokenizer(int64_t vocab = 257, bool has_eod = true)
      : vocab_(vocab), has_eod_(has_eod) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) ids.push_back(c);
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (int32_t id : ids) s.push_back(static_cast<char>(id));
    return s;
  }
  int64_t vocab_size() const override { return vocab_; }
  std::optional<int32_t> eod() const override {
    return has_eod_ ? std::optional<int32_t>(256) : std::nullopt;
  }
  std::string describe() const override { return "test bytes tokenizer"; }

 private:
  int64_t vocab_;
  bool has_eod_;
};

// Whitespace-separated words as ids 66000 + length: needs int32 with a 70000 vocabulary.
class WideTokenizer : public BytesTokenizer {
 public:
  WideTokenizer() : BytesTokenizer(70000) {}
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    size_t i = 0;
    while (i < text.size()) {
      const size_t j = std::min(text.find(' ', i), text.size());
      if (j > i) ids.push_back(66000 + static_cast<int32_t>(j - i));
      i = j + 1;
    }
    return ids;
  }
  std::optional<int32_t> eod() const override { return 69999; }
};

class PreprocessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = std::filesystem::temp_directory_path() /
           ("omnitron_pre_" + std::to_string(::getpid()) + "_" + info->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string write(const std::string& name, const std::string& text) const {
    std::ofstream(path(name), std::ios::binary) << text;
    return path(name);
  }
  static std::string read(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }
  PreprocessConfig config(const std::string& input, const std::string& out = "out") const {
    PreprocessConfig c;
    c.input = input;
    c.output_prefix = path(out);
    c.workers = 2;
    return c;
  }
  static std::vector<std::vector<int32_t>> sequences(const std::string& prefix) {
    IndexedDataset ds(prefix);
    std::vector<std::vector<int32_t>> out;
    for (int64_t s = 0; s < ds.num_sequences(); ++s) {
      std::vector<int32_t> ids(static_cast<size_t>(ds.sequence_length(s)));
      ds.read(s, 0, ds.sequence_length(s), ids.data());
      out.push_back(ids);
    }
    return out;
  }
  static std::vector<int32_t> ids(const std::string& text) { return BytesTokenizer().encode(text); }
  // The error preprocess() throws, or "" when it succeeds.
  std::string error_of(const PreprocessConfig& c) const {
    try {
      preprocess(c, BytesTokenizer());
    } catch (const UsageError& e) {
      return e.what();
    }
    return "";
  }

  std::filesystem::path dir_;
};

// The .idx Megatron's IndexedDatasetBuilder writes: header, lengths, pointers, boundaries.
std::string megatron_idx(uint8_t dtype, int item, const std::vector<int32_t>& lengths,
                         const std::vector<int64_t>& boundaries) {
  std::string b("MMIDIDX\0\0", 9);
  auto put = [&](auto v) { b.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
  put(uint64_t{1});
  put(dtype);
  put(static_cast<uint64_t>(lengths.size()));
  put(static_cast<uint64_t>(boundaries.size()));
  for (int32_t l : lengths) put(l);
  int64_t offset = 0;
  for (int32_t l : lengths) put(offset), offset += int64_t{l} * item;
  for (int64_t d : boundaries) put(d);
  return b;
}

TEST_F(PreprocessTest, JsonEscapesAndUnicodeDecodeToUtf8) {
  std::vector<json::TextField> f;
  const std::vector<std::string> keys{"text"};
  json::parse_text_fields(
      R"({"id": [1, {"text": "no"}], "text": "a\"b\\c\/d\b\f\n\r\t\u00e9\u4e2d\ud83d\ude00 é"})",
      keys, f);
  ASSERT_TRUE(f[0].present);
  EXPECT_EQ(f[0].texts.at(0), "a\"b\\c/d\b\f\n\r\t\xC3\xA9\xE4\xB8\xAD\xF0\x9F\x98\x80 \xC3\xA9");
  // Python's json.loads: the last duplicate key wins; NaN and -Infinity are numbers.
  json::parse_text_fields(R"( {"text": "one", "n": NaN, "m": -Infinity, "text": ["x", ""]} )", keys,
                          f);
  EXPECT_EQ(f[0].texts, (std::vector<std::string>{"x", ""}));
}

TEST_F(PreprocessTest, JsonErrorsNameTheColumn) {
  std::vector<json::TextField> f;
  const std::vector<std::string> keys{"text"};
  auto error = [&](const std::string& line) {
    try {
      json::parse_text_fields(line, keys, f);
    } catch (const UsageError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(error(R"({"text": "a" "b"})"), "column 14: expected '}', found '\"'");
  EXPECT_NE(error(R"({"text": "\ud83d"})").find("lone high surrogate"), std::string::npos);
  EXPECT_NE(error(R"({"text": "\ude00"})").find("lone low surrogate"), std::string::npos);
  EXPECT_NE(error("{\"text\": \"a\tb\"}").find("raw control character"), std::string::npos);
  EXPECT_NE(error(R"({"text": 5})").find("\"text\" is a number"), std::string::npos);
  EXPECT_NE(error(R"({"text": null})").find("\"text\" is null"), std::string::npos);
  EXPECT_NE(error(R"({"text": ["a", 1]})").find("non-string"), std::string::npos);
  EXPECT_NE(error(R"(["text"])").find("expected a JSON object"), std::string::npos);
  EXPECT_NE(error(R"({"text": "a"} x)").find("extra data"), std::string::npos);
  EXPECT_NE(error(R"({"text": "a)").find("unterminated string"), std::string::npos);
  EXPECT_NE(error(R"({"n": 01, "text": ""})").find("expected '}', found '1'"), std::string::npos);
  EXPECT_EQ(error(std::string(600, '[') + std::string(600, ']')).substr(0, 10), "column 514");
}

TEST_F(PreprocessTest, JsonlRoundTripsToMegatronBytes) {
  const std::string input = write("in.jsonl",
                                  "{\"text\": \"ab\\n\\u00e9\"}\n"
                                  "\n"  // blank lines are skipped
                                  "{\"text\": \"\", \"other\": 1}\n"
                                  "{\"text\": \"xyz\"}");  // no final newline
  const PreprocessStats stats = preprocess(config(input), BytesTokenizer());
  EXPECT_EQ(stats.dtype, IndexedDtype::kUInt16);
  EXPECT_EQ(stats.progress.documents, 3);
  ASSERT_EQ(stats.outputs.size(), 1u);
  const std::string prefix = path("out_text_document");
  EXPECT_EQ(stats.outputs[0].prefix, prefix);
  EXPECT_EQ(stats.outputs[0].documents, 3);
  EXPECT_EQ(stats.outputs[0].sequences, 2);
  // The empty document adds a repeated boundary and no sequence, as Megatron's add_document.
  EXPECT_EQ(read(prefix + ".idx"), megatron_idx(8, 2, {5, 3}, {0, 1, 1, 2}));
  const std::string bin = read(prefix + ".bin");
  const std::vector<uint16_t> tokens{'a', 'b', '\n', 0xC3, 0xA9, 'x', 'y', 'z'};
  EXPECT_EQ(bin, std::string(reinterpret_cast<const char*>(tokens.data()), 2 * tokens.size()));
  EXPECT_EQ(sequences(prefix)[0], ids("ab\n\xC3\xA9"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".bin.tmp"));
  EXPECT_FALSE(std::filesystem::exists(prefix + ".lengths.tmp"));
}

TEST_F(PreprocessTest, AppendEodEndsEveryNonEmptyDocument) {
  PreprocessConfig c = config(write("in.jsonl",
                                    "{\"text\": \"ab\"}\n{\"text\": \"\"}\n"
                                    "{\"text\": [\"c\", \"\", \"de\"]}\n"));
  c.append_eod = true;
  preprocess(c, BytesTokenizer());
  const std::string prefix = path("out_text_document");
  // A list of strings is Megatron's pre-split sentences: one sequence each, eod on the last.
  EXPECT_EQ(sequences(prefix),
            (std::vector<std::vector<int32_t>>{{'a', 'b', 256}, {'c'}, {'d', 'e', 256}}));
  EXPECT_EQ(IndexedDataset(prefix).document_boundaries(), (std::vector<int64_t>{0, 1, 1, 3}));
  EXPECT_EQ(read(prefix + ".idx"), megatron_idx(8, 2, {3, 1, 3}, {0, 1, 1, 3}));
}

TEST_F(PreprocessTest, AppendEodNeedsATokenizerWithEod) {
  PreprocessConfig c = config(write("in.jsonl", "{\"text\": \"ab\"}\n"));
  c.append_eod = true;
  EXPECT_THROW(preprocess(c, BytesTokenizer(257, false)), UsageError);
}

TEST_F(PreprocessTest, MultipleJsonKeysWriteOneDatasetEach) {
  PreprocessConfig c = config(write("in.json",
                                    "{\"q\": \"ab\", \"a\": \"c\"}\n"
                                    "{\"a\": \"de\", \"q\": \"f\"}\n"));
  c.json_keys = {"q", "a"};
  const PreprocessStats stats = preprocess(c, BytesTokenizer());
  ASSERT_EQ(stats.outputs.size(), 2u);
  EXPECT_EQ(sequences(path("out_q_document")),
            (std::vector<std::vector<int32_t>>{ids("ab"), ids("f")}));
  EXPECT_EQ(sequences(path("out_a_document")),
            (std::vector<std::vector<int32_t>>{ids("c"), ids("de")}));
}

TEST_F(PreprocessTest, LargeVocabularyWritesInt32) {
  preprocess(config(write("in.jsonl", "{\"text\": \"aa b ccc\"}\n")), WideTokenizer());
  const std::string prefix = path("out_text_document");
  const std::vector<int32_t> tokens{66002, 66001, 66003};
  EXPECT_EQ(read(prefix + ".bin"), std::string(reinterpret_cast<const char*>(tokens.data()), 12));
  EXPECT_EQ(read(prefix + ".idx"), megatron_idx(4, 4, {3}, {0, 1}));
}

TEST_F(PreprocessTest, MissingKeyNamesFileAndLine) {
  const std::string input = write("in.jsonl", "{\"text\": \"a\"}\n\n{\"txt\": \"b\"}\n");
  EXPECT_EQ(error_of(config(input)), input + ":3: no key \"text\" in this JSON object");
}

TEST_F(PreprocessTest, BadJsonNamesFileAndLineAndReplacesNothing) {
  // An earlier run's output stays as it was; no temporary file is left behind.
  const std::string good = write("good.jsonl", "{\"text\": \"old\"}\n");
  preprocess(config(good), BytesTokenizer());
  const std::string before = read(path("out_text_document.idx"));
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "{\"text\": \"line " + std::to_string(i) + "\"}\n";
  text += "{\"text\": \"broken}\n";
  for (int i = 0; i < 100; ++i) text += "{\"text\": \"after\"}\n";
  PreprocessConfig c = config(write("bad.jsonl", text));
  c.batch_bytes = 1000;  // many batches in flight on several workers
  c.workers = 4;
  EXPECT_EQ(error_of(c), path("bad.jsonl") + ":5001: column 18: unterminated string");
  EXPECT_EQ(read(path("out_text_document.idx")), before);
  EXPECT_EQ(sequences(path("out_text_document")), std::vector<std::vector<int32_t>>{ids("old")});
  for (const auto& entry : std::filesystem::directory_iterator(dir_))
    EXPECT_EQ(entry.path().string().find(".tmp"), std::string::npos) << entry.path();
}

TEST_F(PreprocessTest, PlainTextIsOneDocumentPerLine) {
  PreprocessConfig c = config(write("in.txt", "first line\r\n\nthird\n"));
  preprocess(c, BytesTokenizer());
  const std::string prefix = path("out_text_document");
  EXPECT_EQ(sequences(prefix),
            (std::vector<std::vector<int32_t>>{ids("first line"), ids("third")}));
  EXPECT_EQ(IndexedDataset(prefix).document_boundaries(), (std::vector<int64_t>{0, 1, 1, 2}));
  c.json_keys = {"a", "b"};
  EXPECT_NE(error_of(c).find("plain text"), std::string::npos);
}

TEST_F(PreprocessTest, ZstdInputMatchesPlainInput) {
  std::string text;
  for (int i = 0; i < 3000; ++i)
    text += "{\"text\": \"document " + std::to_string(i) + " \\u00e9\"}\n";
  const std::string plain = write("in.jsonl", text);
  ASSERT_EQ(std::system(("zstd -q -f -o " + path("in.jsonl.zst") + " " + plain).c_str()), 0)
      << "the zstd command is needed to make the fixture";
  preprocess(config(plain, "plain"), BytesTokenizer());
  const PreprocessStats stats = preprocess(config(path("in.jsonl.zst"), "zst"), BytesTokenizer());
  EXPECT_EQ(stats.progress.bytes_read, static_cast<int64_t>(text.size()));
  EXPECT_LT(stats.progress.file_bytes_read, stats.progress.bytes_read);
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(read(path("zst_text_document") + ext), read(path("plain_text_document") + ext));
  // A .zst cut short is an error, not a silently shorter dataset.
  const std::string zst = read(path("in.jsonl.zst"));
  write("cut.jsonl.zst", zst.substr(0, zst.size() - 10));
  EXPECT_NE(error_of(config(path("cut.jsonl.zst"), "cut")).find("zstd"), std::string::npos);
}

TEST_F(PreprocessTest, WorkerCountDoesNotChangeTheBytes) {
  std::string text;
  for (int i = 0; i < 20000; ++i)
    text += "{\"text\": \"" + std::string(static_cast<size_t>(i % 97), 'a' + i % 26) + "\"}\n";
  const std::string input = write("in.jsonl", text);
  PreprocessConfig one = config(input, "one"), four = config(input, "four");
  one.workers = 1;
  four.workers = 4;
  one.batch_bytes = four.batch_bytes = 4096;
  four.batches_in_flight = 3;
  preprocess(one, BytesTokenizer());
  preprocess(four, BytesTokenizer());
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(read(path("four_text_document") + ext), read(path("one_text_document") + ext));
}

TEST_F(PreprocessTest, MergeEqualsPreprocessingTheConcatenation) {
  const std::string a = "{\"text\": \"one\"}\n{\"text\": \"\"}\n{\"text\": \"two\"}\n";
  const std::string b = "{\"text\": \"\"}\n{\"text\": [\"th\", \"ree\"]}\n{\"text\": \"four\"}\n";
  std::filesystem::create_directories(path("parts"));
  preprocess(config(write("a.jsonl", a), "parts/a"), BytesTokenizer());
  preprocess(config(write("b.jsonl", b), "parts/b"), BytesTokenizer());
  preprocess(config(write("ab.jsonl", a + b), "whole"), BytesTokenizer());
  // A directory, in sorted order, as Megatron's merge_datasets.py.
  const std::vector<std::string> found = resolve_merge_inputs(path("parts"));
  EXPECT_EQ(found, (std::vector<std::string>{path("parts/a_text_document"),
                                             path("parts/b_text_document")}));
  const MergeStats stats = merge_indexed_datasets(found, path("merged"));
  EXPECT_EQ(stats.datasets, 2);
  EXPECT_EQ(stats.documents, 6);
  for (const char* ext : {".bin", ".idx"})
    EXPECT_EQ(read(path("merged") + ext), read(path("whole_text_document") + ext));
  // A comma-separated list keeps its order.
  EXPECT_EQ(resolve_merge_inputs("x,y/z"), (std::vector<std::string>{"x", "y/z"}));
}

TEST_F(PreprocessTest, MergeRefusesMixedDtypes) {
  preprocess(config(write("a.jsonl", "{\"text\": \"a b\"}\n"), "a"), BytesTokenizer());
  preprocess(config(write("b.jsonl", "{\"text\": \"a b\"}\n"), "b"), WideTokenizer());
  EXPECT_THROW(
      merge_indexed_datasets({path("a_text_document"), path("b_text_document")}, path("m")),
      UsageError);
  EXPECT_FALSE(std::filesystem::exists(path("m.idx")));
  EXPECT_FALSE(std::filesystem::exists(path("m.bin.tmp")));
}

}  // namespace
}  // namespace omni
