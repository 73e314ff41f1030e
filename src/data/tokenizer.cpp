#include "data/tokenizer.h"

#include "base/error.h"
#include "data/tokenizer_impl.h"

namespace omni {

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& o) {
  if (o.type == "GPT2BPETokenizer") return make_gpt2_bpe_tokenizer(o);
  if (o.type == "TikTokenizer") return make_tiktoken_tokenizer(o);
  if (o.type == "HuggingFaceTokenizer") return make_huggingface_tokenizer(o);
  if (o.type == "SentencePieceTokenizer") return make_sentencepiece_tokenizer(o, false);
  if (o.type == "Llama2Tokenizer") return make_sentencepiece_tokenizer(o, true);
  if (o.type == "NullTokenizer") return make_null_tokenizer(o);
  if (o.type == "ByteLevelTokenizer") return make_byte_level_tokenizer(o);
  throw UsageError("--tokenizer-type: '" + o.type +
                   "' is not one of GPT2BPETokenizer, TikTokenizer, HuggingFaceTokenizer, "
                   "SentencePieceTokenizer, Llama2Tokenizer, NullTokenizer, ByteLevelTokenizer");
}

}  // namespace omni
