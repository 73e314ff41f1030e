// NullTokenizer, ByteLevelTokenizer, SentencePieceTokenizer and Llama2Tokenizer, checked against
// Megatron's megatron/training/tokenizer/tokenizer.py (_NullTokenizer, _SentencePieceTokenizer,
// _Llama2Tokenizer) and against libsentencepiece's own encoder. The SentencePiece model is
// trained here, on generated text, with the library's trainer.
#include <gtest/gtest.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "base/error.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {
namespace {

using Ids = std::vector<int32_t>;

template <typename F>
std::string usage_error_of(F&& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "(no UsageError)";
}

std::unique_ptr<Tokenizer> null_tokenizer(int64_t n) {
  TokenizerOptions o;
  o.type = "NullTokenizer";
  o.vocab_size = n;
  return make_null_tokenizer(o);
}

// --- NullTokenizer -------------------------------------------------------------------------

TEST(NullTokenizer, EncodesWhitespaceSeparatedIds) {
  EXPECT_EQ(null_tokenizer(1000)->encode("5 17 0\t999\n 3 "), (Ids{5, 17, 0, 999, 3}));
}

TEST(NullTokenizer, EmptyTextHasNoIds) {
  EXPECT_TRUE(null_tokenizer(10)->encode("").empty());
  EXPECT_TRUE(null_tokenizer(10)->encode(" \n").empty());
}

TEST(NullTokenizer, DecodeJoinsIdsWithSpaces) {
  const Ids ids{5, 17, 0, 10};
  EXPECT_EQ(null_tokenizer(10)->decode(ids), "5 17 0 10");
}

// Megatron: vocab_size = N + 1, eod = eos = N (the id after the N ordinary ones).
TEST(NullTokenizer, VocabIsSizePlusEodAsMegatrons) {
  auto t = null_tokenizer(50);
  EXPECT_EQ(t->vocab_size(), 51);
  EXPECT_EQ(t->eod(), 50);
  EXPECT_EQ(t->bos(), std::nullopt);
  EXPECT_EQ(t->pad(), std::nullopt);
  EXPECT_EQ(t->encode("50"), (Ids{50}));  // the eod id itself is a valid id
}

TEST(NullTokenizer, RejectsNonNumericTokenQuotingIt) {
  const std::string msg = usage_error_of([] { null_tokenizer(10)->encode("1 two 3"); });
  EXPECT_NE(msg.find("'two'"), std::string::npos) << msg;
  EXPECT_NE(usage_error_of([] { null_tokenizer(10)->encode("-1"); }).find("'-1'"),
            std::string::npos);
  EXPECT_NE(usage_error_of([] { null_tokenizer(10)->encode("+1"); }).find("'+1'"),
            std::string::npos);
}

TEST(NullTokenizer, RejectsIdOutsideVocabQuotingIt) {
  const std::string msg = usage_error_of([] { null_tokenizer(10)->encode("3 11"); });
  EXPECT_NE(msg.find("'11'"), std::string::npos) << msg;
  EXPECT_NE(usage_error_of([] {
              null_tokenizer(10)->encode("99999999999999999999");
            }).find("'99999999999999999999'"),
            std::string::npos);
}

TEST(NullTokenizer, RejectsNonPositiveVocabSizeNamingTheOption) {
  const std::string msg = usage_error_of([] { null_tokenizer(0); });
  EXPECT_NE(msg.find("--vocab-size"), std::string::npos) << msg;
}

// --- ByteLevelTokenizer --------------------------------------------------------------------

TEST(ByteLevelTokenizer, IdsAreTheUtf8Bytes) {
  auto t = make_byte_level_tokenizer({});
  EXPECT_EQ(t->encode("Aé"), (Ids{0x41, 0xC3, 0xA9}));
  EXPECT_EQ(t->vocab_size(), 256);
  EXPECT_EQ(t->eod(), std::nullopt);  // all 256 ids are bytes: no room for an eod
}

TEST(ByteLevelTokenizer, RoundTripsInvalidUtf8AndNul) {
  auto t = make_byte_level_tokenizer({});
  std::string bytes;
  for (int b = 0; b < 256; ++b) bytes += static_cast<char>(b);
  bytes += std::string("\xff\xfe\0\xc3(", 5);  // invalid sequences and an embedded NUL
  const Ids ids = t->encode(bytes);
  ASSERT_EQ(ids.size(), bytes.size());
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[b], b);
  EXPECT_EQ(t->decode(ids), bytes);
}

TEST(ByteLevelTokenizer, DecodeRejectsIdAbove255) {
  const Ids ids{65, 256};
  EXPECT_THROW(make_byte_level_tokenizer({})->decode(ids), UsageError);
}

// --- SentencePieceTokenizer / Llama2Tokenizer ------------------------------------------------

// Trains a 200-piece BPE model (unk 0, bos 1, eos 2, no pad: SentencePiece's defaults) on a few
// KB of generated sentences, once per test process; ctest runs each test in its own process,
// so the files carry the pid.
class SentencePieceModel : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    const std::string prefix = ::testing::TempDir() + "omni_spm_" + std::to_string(getpid());
    const std::vector<std::string> words = {
        "the",  "model",     "trains", "on",     "tokens",  "from",     "a",         "corpus",
        "of",   "plain",     "text",   "and",    "every",   "batch",    "holds",     "sequences",
        "with", "loss",      "falls",  "slowly", "while",   "learning", "rate",      "warms",
        "up",   "gradients", "flow",   "back",   "through", "layers",   "attention", "heads"};
    std::mt19937 rng(1234);
    std::string corpus;
    while (corpus.size() < 6000) {
      std::string line;
      const int n = 5 + static_cast<int>(rng() % 8);
      for (int i = 0; i < n; ++i) line += (i ? " " : "") + words[rng() % words.size()];
      corpus += line + ".\n";
    }
    const std::string input = prefix + ".txt";
    std::ofstream(input) << corpus;
    const auto status = sentencepiece::SentencePieceTrainer::Train(
        "--input=" + input + " --model_prefix=" + prefix +
        " --vocab_size=200 --model_type=bpe --character_coverage=1.0 --num_threads=1"
        " --minloglevel=2");
    ASSERT_TRUE(status.ok()) << status.ToString();
    model_path_ = new std::string(prefix + ".model");
    prefix_ = new std::string(prefix);
  }
  static void TearDownTestSuite() {
    for (const char* ext : {".txt", ".model", ".vocab"}) std::remove((*prefix_ + ext).c_str());
    delete prefix_;
    delete model_path_;
    model_path_ = nullptr;
  }

  static std::unique_ptr<Tokenizer> make(bool llama2) {
    TokenizerOptions o;
    o.type = llama2 ? "Llama2Tokenizer" : "SentencePieceTokenizer";
    o.tokenizer_model = *model_path_;
    return make_sentencepiece_tokenizer(o, llama2);
  }
  static sentencepiece::SentencePieceProcessor& library() {
    static sentencepiece::SentencePieceProcessor sp;
    static const bool loaded = sp.Load(*model_path_).ok();
    EXPECT_TRUE(loaded);
    return sp;
  }
  static Ids library_ids(const std::string& text) {
    const std::vector<int> ids = library().EncodeAsIds(text);
    return Ids(ids.begin(), ids.end());
  }

  static inline std::string* prefix_ = nullptr;
  static inline std::string* model_path_ = nullptr;
  const std::string text_ = "the model trains on plain text and every batch warms up slowly.";
};

TEST_F(SentencePieceModel, SentencePieceIdsAreTheLibrarysAndRoundTrip) {
  auto t = make(false);
  const Ids ids = t->encode(text_);
  EXPECT_EQ(ids, library_ids(text_));
  EXPECT_EQ(t->decode(ids), text_);
}

// _SentencePieceTokenizer appends <CLS>, <SEP>, <EOD>, <MASK> and, the model having no pad,
// <PAD> after the model's pieces; bos/eos are the model's <s> and </s>; eod is <EOD>.
TEST_F(SentencePieceModel, SentencePieceAddsMegatronsSpecialTokens) {
  auto t = make(false);
  EXPECT_EQ(library().GetPieceSize(), 200);
  EXPECT_EQ(t->vocab_size(), 205);
  EXPECT_EQ(t->eod(), 202);  // <CLS> 200, <SEP> 201, <EOD> 202, <MASK> 203, <PAD> 204
  EXPECT_EQ(t->pad(), 204);
  EXPECT_EQ(t->bos(), library().bos_id());
  EXPECT_EQ(t->bos(), 1);
}

// Special tokens written in the text are their ids; decode writes them back between spaces.
TEST_F(SentencePieceModel, SentencePieceEncodesSpecialTokensInText) {
  auto t = make(false);
  Ids expected = library_ids("the model");
  expected.push_back(202);
  const Ids tail = library_ids("plain text");
  expected.insert(expected.end(), tail.begin(), tail.end());
  expected.push_back(2);  // </s>, the model's eos piece, is special too
  const Ids ids = t->encode("the model<EOD>plain text</s>");
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(t->decode(ids), "the model <EOD> plain text </s> ");
}

// _Llama2Tokenizer: the model's vocabulary only, eod = eos, and tokenize(bos=True) puts bos
// before every document.
TEST_F(SentencePieceModel, Llama2PrependsBosAndUsesTheModelsIds) {
  auto t = make(true);
  EXPECT_EQ(t->vocab_size(), 200);
  EXPECT_EQ(t->bos(), library().bos_id());
  EXPECT_EQ(t->eod(), library().eos_id());
  EXPECT_EQ(t->pad(), std::nullopt);  // the model's pad_id is -1
  Ids expected{library().bos_id()};
  const Ids pieces = library_ids(text_);
  expected.insert(expected.end(), pieces.begin(), pieces.end());
  const Ids ids = t->encode(text_);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(t->decode(ids), text_);
}

TEST_F(SentencePieceModel, Llama2TreatsSpecialTokensAsText) {
  auto t = make(true);
  Ids expected{1};
  const Ids pieces = library_ids("a<EOD>b");
  expected.insert(expected.end(), pieces.begin(), pieces.end());
  EXPECT_EQ(t->encode("a<EOD>b"), expected);
}

TEST_F(SentencePieceModel, DecodeRejectsIdOutsideVocab) {
  const Ids ids{5, 205};
  EXPECT_THROW(make(false)->decode(ids), UsageError);
  const Ids llama_ids{5, 200};
  EXPECT_THROW(make(true)->decode(llama_ids), UsageError);
}

TEST(SentencePieceTokenizer, MissingModelIsAUsageErrorNamingTheFile) {
  TokenizerOptions o;
  o.tokenizer_model = ::testing::TempDir() + "no_such_tokenizer.model";
  const std::string msg = usage_error_of([&] { make_sentencepiece_tokenizer(o, false); });
  EXPECT_NE(msg.find("no_such_tokenizer.model"), std::string::npos) << msg;
  EXPECT_NE(msg.find("--tokenizer-model"), std::string::npos) << msg;
}

TEST(SentencePieceTokenizer, CorruptModelIsAUsageErrorNamingTheFile) {
  TokenizerOptions o;
  o.tokenizer_model = ::testing::TempDir() + "corrupt_" + std::to_string(getpid()) + ".model";
  std::ofstream(o.tokenizer_model) << "this is not a protobuf \xff\xff\xff\xff";
  const std::string msg = usage_error_of([&] { make_sentencepiece_tokenizer(o, true); });
  std::remove(o.tokenizer_model.c_str());
  EXPECT_NE(msg.find(o.tokenizer_model), std::string::npos) << msg;
}

TEST(SentencePieceTokenizer, NoModelOptionIsAUsageError) {
  const std::string msg = usage_error_of([] { make_sentencepiece_tokenizer({}, false); });
  EXPECT_NE(msg.find("--tokenizer-model"), std::string::npos) << msg;
}

}  // namespace
}  // namespace omni
