// Constructors of each tokenizer kind, called by make_tokenizer (tokenizer.cpp).
#pragma once

#include <memory>

#include "data/tokenizers/tokenizer.h"

namespace omni {

// Byte-level BPE family (bpe.cpp and friends).
std::unique_ptr<Tokenizer> make_gpt2_bpe_tokenizer(const TokenizerOptions& o);
std::unique_ptr<Tokenizer> make_tiktoken_tokenizer(const TokenizerOptions& o);
std::unique_ptr<Tokenizer> make_huggingface_tokenizer(const TokenizerOptions& o);
// SentencePiece (.model through libsentencepiece); llama2 = Megatron's Llama2Tokenizer
// (bos/eos from the model, no extra special tokens).
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const TokenizerOptions& o, bool llama2);
// Megatron's NullTokenizer: whitespace-separated ids; eod = vocab_size - 1 as Megatron's.
std::unique_ptr<Tokenizer> make_null_tokenizer(const TokenizerOptions& o);
// Bytes as ids 0..255 (the demo's tokenizer).
std::unique_ptr<Tokenizer> make_byte_level_tokenizer(const TokenizerOptions& o);

}  // namespace omni
