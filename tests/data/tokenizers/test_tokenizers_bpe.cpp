// Byte-level BPE tokenizers against the npm packages' own encoders (reference ids made
// by tests/fixtures/tokenizers/make_fixtures.sh on mixed.txt) and data-sources.md's
// known answers. The tokenizer files come from scripts/setup.sh (fetch_tokenizers.sh).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {
namespace {

const std::filesystem::path kFixtures = std::filesystem::path(OMNITRON_FIXTURE_DIR) / "tokenizers";
const std::filesystem::path kFiles =
    std::filesystem::path(OMNITRON_FIXTURE_DIR).parent_path().parent_path() / "data" / "tokenizers";

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<int32_t> read_ids(const std::string& name) {
  std::ifstream in(kFixtures / name);
  EXPECT_TRUE(in) << "missing fixture " << (kFixtures / name);
  std::vector<int32_t> ids;
  for (int32_t id; in >> id;) ids.push_back(id);
  return ids;
}

// Fails (does not skip) when the third-party tokenizer files were not fetched.
std::string tokenizer_file(const std::string& relative) {
  const auto path = kFiles / relative;
  if (!std::filesystem::exists(path))
    ADD_FAILURE() << path << " is missing: run scripts/setup.sh (it fetches the tokenizer files)";
  return path.string();
}

std::unique_ptr<Tokenizer> gpt2() {
  TokenizerOptions o;
  o.type = "GPT2BPETokenizer";
  o.vocab_file = tokenizer_file("gpt2/vocab.json");
  o.merge_file = tokenizer_file("gpt2/merges.txt");
  return make_gpt2_bpe_tokenizer(o);
}

std::unique_ptr<Tokenizer> tiktoken(const std::string& name, const std::string& pattern) {
  TokenizerOptions o;
  o.type = "TikTokenizer";
  o.tokenizer_model = tokenizer_file("tiktoken/" + name + ".tiktoken");
  o.tiktoken_pattern = pattern;
  return make_tiktoken_tokenizer(o);
}

std::unique_ptr<Tokenizer> llama3() {
  TokenizerOptions o;
  o.type = "HuggingFaceTokenizer";
  o.tokenizer_model = tokenizer_file("llama3/tokenizer.json");
  return make_huggingface_tokenizer(o);
}

const std::string& mixed_text() {
  static const std::string text = read_text(kFixtures / "mixed.txt");
  return text;
}

// Index of the first difference, for a readable failure on long id lists.
void expect_same_ids(const std::vector<int32_t>& ours, const std::vector<int32_t>& reference) {
  size_t i = 0;
  while (i < ours.size() && i < reference.size() && ours[i] == reference[i]) ++i;
  EXPECT_EQ(ours.size(), reference.size());
  if (i < ours.size() || i < reference.size())
    ADD_FAILURE() << "first difference at id " << i << ": ours "
                  << (i < ours.size() ? std::to_string(ours[i]) : "<end>") << ", reference "
                  << (i < reference.size() ? std::to_string(reference[i]) : "<end>");
}

TEST(Gpt2BpeTokenizer, KnownAnswerFromDataSources) {
  EXPECT_EQ(gpt2()->encode("Hello world, the quick brown fox."),
            (std::vector<int32_t>{15496, 995, 11, 262, 2068, 7586, 21831, 13}));
}

TEST(Gpt2BpeTokenizer, MatchesGpt3EncoderOnMixedText) {
  expect_same_ids(gpt2()->encode(mixed_text()), read_ids("gpt2.ids"));
}

TEST(Gpt2BpeTokenizer, DecodeInvertsEncode) {
  const auto tok = gpt2();
  EXPECT_EQ(tok->decode(tok->encode(mixed_text())), mixed_text());
}

TEST(Gpt2BpeTokenizer, InvalidUtf8RoundTrips) {
  const auto tok = gpt2();
  const std::string bytes = "ok \xff\xfe broken \xe2\x82 tail \xc3";
  EXPECT_EQ(tok->decode(tok->encode(bytes)), bytes);
}

TEST(Gpt2BpeTokenizer, EndOfTextIsEod) {
  const auto tok = gpt2();
  EXPECT_EQ(tok->eod(), 50256);
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->encode("a<|endoftext|>b"), (std::vector<int32_t>{64, 50256, 65}));
}

TEST(Gpt2BpeTokenizer, MissingVocabFileNamesTheOption) {
  TokenizerOptions o;
  o.vocab_file = "/nonexistent/vocab.json";
  o.merge_file = "/nonexistent/merges.txt";
  try {
    make_gpt2_bpe_tokenizer(o);
    FAIL() << "expected UsageError";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("--vocab-file"), std::string::npos) << e.what();
  }
}

TEST(TikTokenizer, R50kMatchesGptTokenizer) {
  expect_same_ids(tiktoken("r50k_base", "v1")->encode(mixed_text()), read_ids("r50k.ids"));
}

TEST(TikTokenizer, Cl100kMatchesGptTokenizer) {
  const auto tok = tiktoken("cl100k_base", "v1");
  expect_same_ids(tok->encode(mixed_text()), read_ids("cl100k.ids"));
  EXPECT_EQ(tok->eod(), 100257);
  EXPECT_EQ(tok->decode(tok->encode(mixed_text())), mixed_text());
}

TEST(TikTokenizer, O200kMatchesGptTokenizer) {
  const auto tok = tiktoken("o200k_base", "v2");
  expect_same_ids(tok->encode(mixed_text()), read_ids("o200k.ids"));
  EXPECT_EQ(tok->eod(), 199999);
  EXPECT_EQ(tok->decode(tok->encode(mixed_text())), mixed_text());
}

TEST(TikTokenizer, RejectsUnknownPattern) {
  TokenizerOptions o;
  o.tokenizer_model = "x.tiktoken";
  o.tiktoken_pattern = "v3";
  EXPECT_THROW(make_tiktoken_tokenizer(o), UsageError);
}

TEST(HuggingFaceTokenizer, Llama3KnownAnswerFromDataSources) {
  EXPECT_EQ(llama3()->encode("Hello world!"), read_ids("llama3_hello.ids"));
  EXPECT_EQ(llama3()->encode("Hello world!"), (std::vector<int32_t>{9906, 1917, 0}));
}

TEST(HuggingFaceTokenizer, Llama3MatchesLenmlTokenizer) {
  const auto tok = llama3();
  expect_same_ids(tok->encode(mixed_text()), read_ids("llama3.ids"));
  EXPECT_EQ(tok->decode(tok->encode(mixed_text())), mixed_text());
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->eod(), 128001);
  EXPECT_EQ(tok->bos(), 128000);
}

TEST(HuggingFaceTokenizer, SpecialTokensAreMatchedLiterally) {
  EXPECT_EQ(llama3()->encode("<|begin_of_text|>Hello world!<|end_of_text|>"),
            (std::vector<int32_t>{128000, 9906, 1917, 0, 128001}));
}

TEST(HuggingFaceTokenizer, MergesInArrayForm) {
  // A minimal tokenizer.json: 256 byte tokens, "ab" from the merge ["a", "b"].
  std::string vocab;
  for (int b = 0; b < 256; ++b) {
    std::string cp;
    const char32_t c = bpe::byte_to_unicode()[b];
    if (c < 0x80) cp = std::string(1, char(c));
    else cp = {char(0xC0 | (c >> 6)), char(0x80 | (c & 0x3F))};
    if (cp == "\"" || cp == "\\") cp = "\\" + cp;
    vocab += "\"" + cp + "\": " + std::to_string(b) + ", ";
  }
  vocab += "\"ab\": 256";
  const std::string json =
      R"({"added_tokens": [{"id": 257, "content": "<eos>", "special": true}], "normalizer": null,
          "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
          "model": {"type": "BPE", "vocab": {)" +
      vocab + R"(}, "merges": [["a", "b"]]}})";
  const auto path = std::filesystem::temp_directory_path() / "omnitron_bpe_array_merges.json";
  std::ofstream(path) << json;
  TokenizerOptions o;
  o.tokenizer_model = path.string();
  const auto tok = make_huggingface_tokenizer(o);
  EXPECT_EQ(tok->encode("abab<eos>"), (std::vector<int32_t>{256, 256, 257}));
  EXPECT_EQ(tok->vocab_size(), 258);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace omni
