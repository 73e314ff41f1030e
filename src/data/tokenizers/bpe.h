// The byte-level BPE engine shared by GPT2BPETokenizer, TikTokenizer and
// HuggingFaceTokenizer: literal special tokens, regex pre-tokenisation (PCRE2, UTF + UCP,
// JIT-compiled), then byte pair merges over each pre-token's raw bytes.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizers/tokenizer.h"

namespace omni::bpe {

// The whole file, or UsageError naming `option` and saying how to get the tokenizer files.
std::string read_file(const std::string& path, const std::string& option);

// GPT-2's bytes_to_unicode(): the printable stand-in code point for each byte, used by
// vocab.json, merges.txt and Hugging Face ByteLevel vocabularies.
const std::array<char32_t, 256>& byte_to_unicode();
// The raw bytes a ByteLevel token string stands for; nullopt if a character is not one
// of the 256 stand-ins.
std::optional<std::string> unicode_to_bytes(std::string_view token);

// Heterogeneous lookup: maps keyed by std::string probed with a string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using TokenMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

// Which pair of adjacent parts merges first.
enum class MergeRule {
  kPairRank,    // merges.txt / tokenizer.json: the pair listed earliest (GPT-2, Hugging Face)
  kTokenRank,   // tiktoken: the pair whose concatenation has the lowest rank
};

// Everything the engine needs; the three tokenizer files fill one in.
struct BpeModel {
  std::string name;                   // for describe(), e.g. "GPT2BPETokenizer"
  std::string pattern;                // pre-tokenisation regex (PCRE2 syntax)
  MergeRule rule = MergeRule::kPairRank;
  std::vector<std::string> id_bytes;  // id -> raw bytes (special tokens: their text)
  // kPairRank: (left id << 32 | right id) -> (rank, merged id).
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> pair_merges;
  // Raw bytes -> id for ordinary tokens (kTokenRank: the rank is the id).
  TokenMap token_ids;
  // Hugging Face's ignore_merges: a pre-token that is itself a token is emitted whole.
  bool ignore_merges = false;
  std::vector<std::pair<std::string, int32_t>> special_tokens;  // matched literally in text
  int64_t vocab_size = 0;
  std::optional<int32_t> eod, bos, pad;
};

class BpeTokenizer final : public Tokenizer {
 public:
  // Throws UsageError naming `source` if the pattern does not compile or a byte has no id.
  BpeTokenizer(BpeModel model, const std::string& source);
  ~BpeTokenizer() override;
  BpeTokenizer(const BpeTokenizer&) = delete;
  BpeTokenizer& operator=(const BpeTokenizer&) = delete;

  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int64_t vocab_size() const override { return model_.vocab_size; }
  std::optional<int32_t> eod() const override { return model_.eod; }
  std::optional<int32_t> bos() const override { return model_.bos; }
  std::optional<int32_t> pad() const override { return model_.pad; }
  std::string describe() const override;

  // One pre-token's ids by BPE (no cache, no pre-tokenisation): exposed for tests.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

 private:
  struct Regex;
  void encode_ordinary(std::string_view text, std::vector<int32_t>& out) const;

  BpeModel model_;
  std::array<int32_t, 256> byte_ids_{};
  std::unique_ptr<Regex> pretokenizer_;
  std::unique_ptr<Regex> specials_;  // null when there are no special tokens
  TokenMap special_ids_;
  uint64_t serial_;                  // identifies this tokenizer's per-thread word cache
};

}  // namespace omni::bpe
