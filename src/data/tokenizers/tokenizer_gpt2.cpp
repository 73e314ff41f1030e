// Megatron's GPT2BPETokenizer: OpenAI's GPT-2 encoder from vocab.json (encoder.json) and
// merges.txt (vocab.bpe), token for token.
#include <sstream>

#include "base/error.h"
#include "base/json.h"
#include "data/tokenizers/bpe.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {

namespace {

// OpenAI's gpt-2 src/encoder.py pattern (also tiktoken's "gpt2"/"r50k_base" pat_str).
constexpr const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace

std::unique_ptr<Tokenizer> make_gpt2_bpe_tokenizer(const TokenizerOptions& o) {
  OMNI_REQUIRE(!o.vocab_file.empty(), "--vocab-file: GPT2BPETokenizer needs vocab.json");
  OMNI_REQUIRE(!o.merge_file.empty(), "--merge-file: GPT2BPETokenizer needs merges.txt");
  bpe::BpeModel m;
  m.name = "GPT2BPETokenizer";
  m.pattern = kGpt2Pattern;
  m.rule = bpe::MergeRule::kPairRank;

  const json::Value vocab = json::parse(bpe::read_file(o.vocab_file, "--vocab-file"), o.vocab_file);
  OMNI_REQUIRE(vocab.is_object(), "--vocab-file ", o.vocab_file,
               ": expected a JSON object of token -> id (GPT-2's vocab.json)");
  bpe::TokenMap by_text;  // the ByteLevel string of each token -> id, for merges.txt
  for (const auto& [text, id] : vocab.obj()) {
    OMNI_REQUIRE(id.is_number() && id.num() >= 0 && id.num() < 1e9, "--vocab-file ", o.vocab_file,
                 ": the id of token '", text, "' is not a non-negative integer");
    const auto index = int32_t(id.num());
    const auto bytes = bpe::unicode_to_bytes(text);
    // "<|endoftext|>" is in vocab.json in plain text; it is the one special token.
    const std::string raw = bytes ? *bytes : text;
    if (size_t(index) >= m.id_bytes.size()) m.id_bytes.resize(size_t(index) + 1);
    m.id_bytes[size_t(index)] = raw;
    by_text.emplace(text, index);
    if (text == "<|endoftext|>") m.special_tokens.emplace_back(text, index);
    else m.token_ids.emplace(raw, index);
  }

  const std::string merges = bpe::read_file(o.merge_file, "--merge-file");
  std::istringstream lines(merges);
  std::string line;
  int32_t rank = 0;
  int line_no = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line.rfind("#version", 0) == 0) continue;
    const size_t space = line.find(' ');
    OMNI_REQUIRE(space != std::string::npos && line.find(' ', space + 1) == std::string::npos,
                 "--merge-file ", o.merge_file, ":", line_no,
                 ": expected two tokens separated by one space, got '", line, "'");
    const auto left = by_text.find(std::string_view(line).substr(0, space));
    const auto right = by_text.find(std::string_view(line).substr(space + 1));
    const std::string joined = line.substr(0, space) + line.substr(space + 1);
    const auto result = by_text.find(joined);
    OMNI_REQUIRE(left != by_text.end() && right != by_text.end() && result != by_text.end(),
                 "--merge-file ", o.merge_file, ":", line_no, ": merge '", line,
                 "' uses a token that is not in ", o.vocab_file);
    const uint64_t key = (uint64_t(uint32_t(left->second)) << 32) | uint32_t(right->second);
    m.pair_merges.emplace(key, std::make_pair(rank++, result->second));
  }
  m.vocab_size = int64_t(m.id_bytes.size());
  const auto eod = by_text.find("<|endoftext|>");
  OMNI_REQUIRE(eod != by_text.end(), "--vocab-file ", o.vocab_file,
               ": expected GPT-2's '<|endoftext|>' token");
  m.eod = eod->second;
  return std::make_unique<bpe::BpeTokenizer>(std::move(m), o.vocab_file);
}

}  // namespace omni
