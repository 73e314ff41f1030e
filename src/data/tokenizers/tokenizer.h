// Tokenizers behind one interface, selected as Megatron selects them (--tokenizer-type).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace omni {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Text to ids. Special tokens written literally in the text (e.g. "<|endoftext|>") are
  // encoded as their ids, as Megatron's tokenizers do for the documents they preprocess.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Number of ids the model must embed (the largest id + 1), before padding.
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> eod() const { return std::nullopt; }
  virtual std::optional<int32_t> bos() const { return std::nullopt; }
  virtual std::optional<int32_t> pad() const { return std::nullopt; }
  virtual std::string describe() const = 0;  // e.g. "GPT2BPETokenizer (50257 tokens)"
};

// The --tokenizer-* options, Megatron's names.
struct TokenizerOptions {
  std::string type;              // --tokenizer-type: GPT2BPETokenizer, TikTokenizer,
                                 // HuggingFaceTokenizer, SentencePieceTokenizer,
                                 // Llama2Tokenizer, NullTokenizer, ByteLevelTokenizer;
                                 // Primus's Llama3Tokenizer, Llama4Tokenizer,
                                 // MixtralTokenizer, DeepSeekV2Tokenizer, DeepSeekV3Tokenizer
  std::string vocab_file;        // --vocab-file (GPT-2 vocab.json)
  std::string merge_file;        // --merge-file (GPT-2 merges.txt)
  std::string tokenizer_model;   // --tokenizer-model (.tiktoken, tokenizer.json or .model;
                                 // a directory or a hub id: data/tokenizers/hf_hub.h)
  std::string tiktoken_pattern;  // --tiktoken-pattern: v1 (cl100k-style, default), v2 (o200k)
  int64_t vocab_size = 0;        // --vocab-size: NullTokenizer's size
};

// Throws UsageError naming the option or file that is missing or malformed.
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& options);

}  // namespace omni
