#include "data/tokenizers/tokenizer.h"

#include "base/error.h"
#include "data/tokenizers/hf_hub.h"
#include "data/tokenizers/tokenizer_impl.h"

namespace omni {

namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// --tokenizer-model as a file, a directory or a Hugging Face hub id (data/tokenizers/hf_hub.h).
TokenizerOptions with_file(const TokenizerOptions& o, const std::vector<std::string>& files) {
  TokenizerOptions r = o;
  r.tokenizer_model = find_tokenizer_file(o.tokenizer_model, files);
  return r;
}

}  // namespace

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerOptions& o) {
  if (o.type == "GPT2BPETokenizer") return make_gpt2_bpe_tokenizer(o);
  if (o.type == "TikTokenizer") return make_tiktoken_tokenizer(o);
  if (o.type == "HuggingFaceTokenizer")
    return make_huggingface_tokenizer(with_file(o, {"tokenizer.json"}));
  if (o.type == "SentencePieceTokenizer")
    return make_sentencepiece_tokenizer(with_file(o, {"tokenizer.model"}), false);
  if (o.type == "Llama2Tokenizer")
    return make_sentencepiece_tokenizer(with_file(o, {"tokenizer.model"}), true);
  if (o.type == "NullTokenizer") return make_null_tokenizer(o);
  if (o.type == "ByteLevelTokenizer") return make_byte_level_tokenizer(o);
  // Primus's names (its Megatron tokenizer.py): each is the Hugging Face tokenizer of its
  // tokenizer_model. Llama 3/4 and DeepSeek ship byte-level BPE tokenizer.json files; Mixtral
  // is SentencePiece, read from its tokenizer.model (the same ids as its tokenizer.json).
  if (o.type == "Llama3Tokenizer" || o.type == "Llama4Tokenizer" ||
      o.type == "DeepSeekV2Tokenizer" || o.type == "DeepSeekV3Tokenizer")
    return make_huggingface_tokenizer(with_file(o, {"tokenizer.json"}));
  if (o.type == "MixtralTokenizer") {
    const TokenizerOptions r = with_file(o, {"tokenizer.model", "tokenizer.json"});
    return ends_with(r.tokenizer_model, ".json") ? make_huggingface_tokenizer(r)
                                                 : make_sentencepiece_tokenizer(r, true);
  }
  throw UsageError("--tokenizer-type: '" + o.type +
                   "' is not one of GPT2BPETokenizer, TikTokenizer, HuggingFaceTokenizer, "
                   "SentencePieceTokenizer, Llama2Tokenizer, NullTokenizer, ByteLevelTokenizer, "
                   "or Primus's Llama3Tokenizer, Llama4Tokenizer, MixtralTokenizer, "
                   "DeepSeekV2Tokenizer, DeepSeekV3Tokenizer");
}

}  // namespace omni
